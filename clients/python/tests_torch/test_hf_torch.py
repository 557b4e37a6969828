"""HFCallback in a real transformers Trainer on CPU: a 1-layer GPT-2 built from a config (nothing
downloaded) on a tiny in-memory dataset."""

import pytest

import support
from frameworks import ACCUMULATE, EXACT, GLOBAL_STEPS, check_trainer_session

pytestmark = pytest.mark.frameworks

torch = support.require("torch")


@pytest.fixture(scope="module")
def transformers():
    # Imported here, not at module level, so `-m "not frameworks"` runs without transformers.
    support.require("accelerate")  # transformers' Trainer needs it
    return support.require("transformers")

SEQ = 8
BATCH = 2


class Tokens(torch.utils.data.Dataset):
    def __init__(self, rows, seed):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 32, (rows, SEQ), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_hf_trainer(transformers, ingest, source, tmp_path):
    from gpumon_client.callbacks import HFCallback

    config = transformers.GPT2Config(
        vocab_size=32, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        max_steps=GLOBAL_STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        eval_strategy="steps",
        eval_steps=2,  # evaluation after global steps 2 and 4
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    callback = HFCallback(job="hf", source=source, socket=ingest.path, **EXACT)
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(GLOBAL_STEPS * ACCUMULATE * BATCH, seed=1),
        eval_dataset=Tokens(2 * BATCH, seed=2),
        callbacks=[callback],
    )
    trainer.train()
    assert trainer.state.global_step == GLOBAL_STEPS
    msgs = ingest.messages()
    if ingest.up:
        check_trainer_session(msgs, "hf")
