"""The core: the driver (run), the hook engine (hooks), module selection, errors, the output
contract, load options, torchrun, and the vocabulary every layer shares."""
