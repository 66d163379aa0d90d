"""transformers' ``run_image_classification.py``: an image-classification model from a config
with the label maps (a tiny ViT), normalised images, its ``collate_fn``, ``Trainer`` with
``TrainingArguments``, on random 16x16 images; the watch is the ``WatchCallback``, used as a
context manager. Faults: ``nan_pixels`` (a NaN pixel in optimiser step 1's batch),
``custom_backward`` (a NaN-backward ``autograd.Function`` in layer 0's first MLP Linear),
``classifier_tiny`` (classifier.weight x 1e-6: every gradient below it vanishes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from torchvision.transforms import Normalize

from hookscope.integrations.transformers import WatchCallback

from .faults import in_forward, nan_grad, scale

LABELS = ["cat", "dog", "fish"]
MLP_IN = "vit.layers.0.mlp.fc1"  # layer 0's first MLP Linear (transformers 5)


def main(log_dir: Path, fault: str | None = None, steps: int = 3, every: int = 1) -> None:
    transformers.set_seed(1)
    label2id = {label: str(i) for i, label in enumerate(LABELS)}
    config = transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, num_labels=len(LABELS),
                                    label2id=label2id, id2label={v: k for k, v in label2id.items()},
                                    finetuning_task="image-classification")
    model = transformers.ViTForImageClassification(config)
    if fault == "custom_backward":
        in_forward(model.get_submodule(MLP_IN), after=nan_grad)
    if fault == "classifier_tiny":
        scale(model.classifier.weight, 1e-6)
    normalize = Normalize(mean=[0.5] * 3, std=[0.5] * 3)
    train = [{"pixel_values": normalize(torch.rand(3, 16, 16)), "labels": i % len(LABELS)}
             for i in range(2 * steps)]
    batches = []

    def collate_fn(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        batches.append(pixel_values)
        if fault == "nan_pixels" and len(batches) == 2:
            pixel_values[0, 0, 3, 3] = float("nan")
        return {"pixel_values": pixel_values,
                "labels": torch.tensor([example["labels"] for example in examples])}

    args = transformers.TrainingArguments(output_dir=str(log_dir / "out"), max_steps=steps,
                                          per_device_train_batch_size=2, report_to=[], logging_steps=1,
                                          save_strategy="no", use_cpu=True, remove_unused_columns=False,
                                          dataloader_num_workers=0, disable_tqdm=True)
    callback = WatchCallback(log_dir=log_dir / "watch", every=every)
    with callback:
        trainer = transformers.Trainer(model=model, args=args, train_dataset=train,
                                       data_collator=collate_fn, callbacks=[callback])
        trainer.train()
