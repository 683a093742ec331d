"""Built-in fine-tune: Ray Train TorchTrainer (DDP / FSDP / DeepSpeed), optional LoRA.

Runs as ``python finetune.py`` next to ``ctfleet.py`` and ``ctfleet_spec.json``; the training loop needs
torch and transformers (peft for LoRA, deepspeed for DeepSpeed) on the workers.
"""

import os
import tempfile


def storage_path(spec):
    """Where Ray Train keeps the run and its checkpoints."""
    return os.path.expanduser(spec.get("storage_path") or "~/ctfleet-checkpoints")


def shard(texts, rank, world):
    """This worker's share of the dataset lines."""
    return texts[rank::world]


def read_texts(path):
    """The dataset's non-blank lines, stripped."""
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def checkpoint_due(epoch, every, epochs):
    """True when `epoch` ends with a checkpoint: every `every` epochs (0: never) and always the last."""
    return bool(every and epoch % every == 0) or epoch == epochs


def scaling_kwargs(scaling):
    """`ScalingConfig` arguments from the spec's scaling."""
    return {
        "num_workers": scaling["num_workers"],
        "use_gpu": scaling["gpus_per_worker"] > 0,
        "resources_per_worker": {"CPU": scaling["cpus_per_worker"], "GPU": scaling["gpus_per_worker"]},
    }


def train_loop(cfg):
    """One Ray Train worker: fine-tune `cfg["model"]` on its shard of the dataset, reporting each epoch."""
    import ray.train
    import ray.train.torch
    import torch
    from ray.train import Checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model"])
    if cfg.get("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **cfg["lora"]))
    framework = cfg["framework"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg.get("learning_rate", 2e-5)))
    if framework == "deepspeed":
        import deepspeed

        model, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg["deepspeed_config"])
    else:
        model = ray.train.torch.prepare_model(model, parallel_strategy="fsdp" if framework == "torch_fsdp" else "ddp")
    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    texts = shard(read_texts(cfg["dataset"]), rank, world)
    every = int(cfg.get("checkpoint_every", 1))
    epochs = int(cfg.get("epochs", 1))
    for epoch in range(1, epochs + 1):
        total = 0.0
        for text in texts:
            batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=int(cfg.get("max_length", 512)))
            batch = {k: v.to(ray.train.torch.get_device()) for k, v in batch.items()}
            loss = model(**batch, labels=batch["input_ids"]).loss
            if framework == "deepspeed":
                model.backward(loss)
                model.step()
            else:
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            total += float(loss)
        metrics = {"epoch": epoch, "loss": total / max(1, len(texts))}
        if checkpoint_due(epoch, every, epochs):
            with tempfile.TemporaryDirectory() as tmp:
                if rank == 0:
                    unwrapped = getattr(model, "module", model)
                    unwrapped.save_pretrained(tmp)
                    tokenizer.save_pretrained(tmp)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))
        else:
            ray.train.report(metrics)


def main():
    """Fit the TorchTrainer the spec describes; register its last checkpoint."""
    import ctfleet
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    spec = ctfleet.SPEC
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=dict(spec["config"], framework=spec["framework"]),
        scaling_config=ScalingConfig(**scaling_kwargs(spec["scaling"])),
        run_config=RunConfig(
            name=spec["job"],
            storage_path=storage_path(spec),
            checkpoint_config=CheckpointConfig(num_to_keep=spec["checkpoints_to_keep"]),
        ),
    )
    result = trainer.fit()
    if result.checkpoint is not None:
        ctfleet.report_checkpoint(result.checkpoint.path, **(result.metrics or {}))


if __name__ == "__main__":
    main()
