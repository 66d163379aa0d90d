"""``hookscope check``: the rules (:mod:`.engine`), their TOML file (:mod:`.rulefile`), the
stats baseline they compare with (:mod:`.baseline`) and a training log's rules (:mod:`.log`).
Torch-free.
"""
