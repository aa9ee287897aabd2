"""How well the AI-feedback judge's scores track known labels on function_fit programs.

Scores a small labelled set of programs on the axes of ``conf/descriptor/<name>.yaml``
(default ``ai_feedback``) with the embedded SmolLM2 server (or ``--base-url``/``--model``
for any OpenAI-compatible judge), and prints ``descriptors.ai_feedback.agreement``
per axis, its AUC with a 95 % bootstrap interval (``qd.judge_stats``). Usage::

    python experiments/function_fit/judge_agreement.py
    python experiments/function_fit/judge_agreement.py --base-url http://127.0.0.1:8000/v1 --model qwen
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from descriptors import Item, make_descriptor
from descriptors.ai_feedback import agreement
from qd import judge_stats
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.paths import conf_dir

# Programs with a known side of each axis: 0 = the low end, 1 = the high end.
LABELLED = {
    "style": [
        ("def f(x):\n    return x + 1.0\n", 0),
        ("def f(x):\n    return 2.0 * x\n", 0),
        ("def f(x):\n    return x * x - 3.0\n", 0),
        (
            "def f(x):\n"
            "    a = x * x\n"
            "    b = 0.5 * x\n"
            "    if a > b:\n"
            "        return a + b\n"
            "    return a - b\n",
            1,
        ),
        ("def f(x):\n    s = 0.0\n    for i in range(4):\n        s += x ** i / (i + 1)\n    return s\n", 1),
        (
            "def f(x):\n"
            "    y = abs(x)\n"
            "    while y > 1.0:\n"
            "        y = y / 2.0\n"
            "    z = y * x\n"
            "    return z + 2.0\n",
            1,
        ),
    ],
    "math": [
        ("def f(x):\n    return 3.0 * x + 1.0\n", 0),
        ("def f(x):\n    return x * x + 0.5 * x + 2.0\n", 0),
        ("def f(x):\n    y = x - 1.0\n    return y * y\n", 0),
        ("def f(x):\n    return math.sin(x) + math.cos(2.0 * x)\n", 1),
        ("def f(x):\n    return math.exp(-x * x) * math.sqrt(abs(x) + 1.0)\n", 1),
        ("def f(x):\n    return math.log(1.0 + x * x) + math.tanh(x)\n", 1),
    ],
}


async def measure(descriptor, client: LLMClient) -> dict[str, dict]:
    descriptor.attach(None, client)
    out = {}
    for j, axis in enumerate(descriptor.axes):
        if axis.name not in LABELLED:
            continue
        texts, labels = zip(*LABELLED[axis.name])
        described = await descriptor.judge_scores([Item(t) for t in texts])
        out[axis.name] = {
            **agreement(described.values[:, j], labels),
            **judge_stats.auc(described.values[:, j], labels),  # with its 95 % interval
            "scores": [round(float(v), 3) for v in described.values[:, j]],
        }
    await client.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--descriptor", default="ai_feedback", help="a conf/descriptor/ file with an ai_feedback part"
    )
    ap.add_argument("--base-url", help="an OpenAI-compatible server; default: start the embedded SmolLM2")
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()
    parts = OmegaConf.to_container(OmegaConf.load(conf_dir() / "descriptor" / f"{args.descriptor}.yaml"))[
        "parts"
    ]
    part = next(p for p in parts if p["kind"] == "ai_feedback")
    part.setdefault("model", None)
    for axis in part["axes"]:
        axis.setdefault("bins", 10)
    descriptor = make_descriptor("ai_feedback", part)

    def client(base_url: str, model: str) -> LLMClient:
        return LLMClient(
            LLMSettings(base_url=base_url, models=(ModelSpec(model),), concurrency=2, timeout_s=120)
        )

    if args.base_url:
        result = asyncio.run(measure(descriptor, client(args.base_url, args.model)))
    else:
        from qd.llm.server import EmbeddedServer

        with EmbeddedServer(log_path=Path(tempfile.mkdtemp()) / "server.log") as server:
            result = asyncio.run(measure(descriptor, client(server.base_url, server.model)))
    for name, row in result.items():
        print(f"{name}: " + json.dumps(row))


if __name__ == "__main__":
    main()
