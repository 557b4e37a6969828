"""LightningCallback in a real Lightning Trainer on CPU."""

import pytest

import support
from frameworks import ACCUMULATE, EXACT, GLOBAL_STEPS, check_trainer_session

pytestmark = pytest.mark.frameworks

torch = support.require("torch")


@pytest.fixture(scope="module")
def pl():
    # Imported here, not at module level, so `-m "not frameworks"` runs without Lightning.
    return support.require("lightning.pytorch")


def tiny_module(pl):
    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny()


def loader(rows):
    gen = torch.Generator().manual_seed(rows)
    data = torch.utils.data.TensorDataset(torch.randn(rows, 8, generator=gen), torch.randn(rows, 1, generator=gen))
    return torch.utils.data.DataLoader(data, batch_size=2)


def test_lightning_trainer(pl, ingest, source, tmp_path):
    from gpumon_client.callbacks import LightningCallback

    torch.manual_seed(0)
    callback = LightningCallback(job="pl", source=source, socket=ingest.path, **EXACT)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=GLOBAL_STEPS,
        accumulate_grad_batches=ACCUMULATE,
        val_check_interval=2 * ACCUMULATE,  # batches: validation after global steps 2 and 4
        limit_val_batches=2,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
    )
    trainer.fit(tiny_module(pl), loader(GLOBAL_STEPS * ACCUMULATE * 2), loader(4))
    assert trainer.global_step == GLOBAL_STEPS
    msgs = ingest.messages()
    if ingest.up:
        check_trainer_session(msgs, "pl")
