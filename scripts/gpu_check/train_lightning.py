"""A Lightning trainer with gpumon's LightningCallback: a small MLP on random data, validation
every --val-every steps (the callback marks those samples phase "eval"), nothing downloaded and
no checkpoints or logs written."""

from __future__ import annotations

import trainer_common as tc


def main() -> None:
    p = tc.parser(__doc__, seconds=60)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--val-every", type=int, default=100)
    p.add_argument("--job", default="gpu-check-lightning")
    args = p.parse_args()
    tc.setup(args)
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl  # the older package name
    from gpumon_client import LightningCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))

        def training_step(self, batch, _idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, _idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
    train = DataLoader(data, batch_size=64, shuffle=True, num_workers=0)
    val = DataLoader(data, batch_size=256, num_workers=0)
    trainer = pl.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        max_steps=args.steps,
        max_time={"seconds": int(args.seconds)},
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=4,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=None,
        callbacks=[LightningCallback(job=args.job)],
    )
    trainer.fit(Module(), train, val)
    tc.write_result(args.result, {"steps": int(trainer.global_step), "val_every": args.val_every})


if __name__ == "__main__":
    main()
