"""Our own small adaptations of five public training scripts (pytorch/examples mnist, imagenet
and dcgan, Lightning's backbone image classifier under ``LightningCLI``, transformers'
``run_image_classification.py``): each keeps its script's model, loss, optimiser and loop, on
synthetic data, with the few lines that add ``hookscope.watch``; ``fault`` plants one fault
(:mod:`.faults`)."""
