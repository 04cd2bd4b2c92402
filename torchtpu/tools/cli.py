"""The ``torchtpu`` command: ``torchtpu info``, ``torchtpu demo`` and ``torchtpu tune``."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def info(args: argparse.Namespace) -> int:
    """Print the platform, chips, memory and the versions that matter."""
    import torch

    import torchtpu

    props = torch.tpu.get_device_properties()
    free, total = torch.tpu.mem_get_info()
    from ..runtime import native

    print(f"device:    tpu:{torch.tpu.current_device()} ({props.name}), {torch.tpu.device_count()} on this host")
    print(f"extension: {'built' if native.module else 'not built or disabled: tpu:0 only, no FSDP2'}")
    print(f"platform:  {props.platform}")
    print(f"chips:     {props.chip_count}")
    print(f"memory:    {_gib(total)} total, {_gib(free)} free")
    print(f"torchtpu:  {torchtpu.__version__}")
    print(f"torch:     {torch.__version__}")
    print(f"jax:       {_version('jax')}")
    print(f"jaxlib:    {_version('jaxlib')}")
    return 0


def demo(args: argparse.Namespace) -> int:
    """Train the small character GPT and print a sample."""
    from . import demo as demo_module

    train_cfg = demo_module.TrainConfig(
        steps=args.steps, device=args.device, seed=args.seed, batch_size=args.batch_size,
        log_every=args.log_every, sample_chars=args.sample_chars, temperature=args.temperature,
        compile=args.compile,
    )
    model_cfg = demo_module.ModelConfig(
        n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, block_size=args.block_size,
    )
    demo_module.run(train_cfg, model_cfg)
    return 0


def _parser() -> argparse.ArgumentParser:
    from .demo import ModelConfig, TrainConfig

    parser = argparse.ArgumentParser(prog="torchtpu", description="PyTorch on the 'tpu' device, via XLA.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="show the platform, chips, memory and versions").set_defaults(fn=info)

    train, model = TrainConfig(), ModelConfig()
    p = commands.add_parser("demo", help="train a small character-level GPT and print a sample",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.set_defaults(fn=demo)
    p.add_argument("--steps", type=int, default=train.steps, help="training steps")
    p.add_argument("--device", default=train.device, help="'tpu', or 'cpu' to compare")
    p.add_argument("--seed", type=int, default=train.seed)
    p.add_argument("--batch-size", type=int, default=train.batch_size)
    p.add_argument("--log-every", type=int, default=train.log_every)
    p.add_argument("--sample-chars", type=int, default=train.sample_chars, help="length of the sample")
    p.add_argument("--temperature", type=float, default=train.temperature)
    p.add_argument("--compile", action="store_true", help="torch.compile the forward and backward")
    p.add_argument("--n-layer", type=int, default=model.n_layer)
    p.add_argument("--n-embd", type=int, default=model.n_embd)
    p.add_argument("--n-head", type=int, default=model.n_head)
    p.add_argument("--block-size", type=int, default=model.block_size, help="characters of context")

    from .tune import cli as tune_cli

    tune = commands.add_parser("tune", help="find what slows a program down, predict it on TPU, fix it")
    tune_cli.add_commands(tune)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
