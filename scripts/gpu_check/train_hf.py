"""A Hugging Face Trainer with gpumon's HFCallback: a tiny GPT-2 built from a config (random
weights, nothing downloaded), random token data, evaluation every --eval-every steps (phase
"eval"), no checkpoints, reports or logs."""

from __future__ import annotations

import inspect
import tempfile

import trainer_common as tc


def main() -> None:
    p = tc.parser(__doc__, seconds=60)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--job", default="gpu-check-hf")
    args = p.parse_args()
    tc.setup(args)
    import torch
    import transformers
    from gpumon_client import HFCallback

    config = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(args.seed)
            self.ids = torch.randint(0, config.vocab_size, (n, 64), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    # Names moved between transformers releases: pass only the ones this version takes.
    known = set(inspect.signature(transformers.TrainingArguments.__init__).parameters)
    wanted = {
        "output_dir": tempfile.mkdtemp(prefix="gpu-check-hf-"),
        "max_steps": args.steps,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 16,
        "eval_steps": args.eval_every,
        "eval_strategy": "steps",
        "evaluation_strategy": "steps",
        "save_strategy": "no",
        "logging_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "use_cpu": args.device == "cpu",
        "no_cuda": args.device == "cpu",
        "seed": args.seed,
    }
    if "eval_strategy" in known:
        wanted.pop("evaluation_strategy")
    if "use_cpu" in known:
        wanted.pop("no_cuda")
    targs = transformers.TrainingArguments(**{k: v for k, v in wanted.items() if k in known})
    trainer = transformers.Trainer(
        model=model,
        args=targs,
        train_dataset=Tokens(1024),
        eval_dataset=Tokens(64),
        callbacks=[HFCallback(job=args.job)],
    )
    out = trainer.train()
    tc.write_result(args.result, {"steps": int(out.global_step), "eval_every": args.eval_every})


if __name__ == "__main__":
    main()
