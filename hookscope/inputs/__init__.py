"""Inputs: what data (files, folders, tensors, stdin), preprocessed how, in what batches (in
process or in DataLoader workers)."""
