from hookscope.cli import main

main()
