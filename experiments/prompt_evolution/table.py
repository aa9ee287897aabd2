"""The prompt_evolution table: run seeds, then the best prompt found vs every hand-written prompt, held out.

    python experiments/prompt_evolution/table.py --seeds 0 1 2 --max-llm-calls 250

See ``experiments/agent_design/heldout.py`` for what is measured and the options.
"""

import sys
from pathlib import Path

from qd.task import load_module

if __name__ == "__main__":
    heldout = load_module(
        Path(__file__).resolve().parents[1] / "agent_design" / "heldout.py", "experiments_heldout"
    )
    heldout.main("prompt_evolution", sys.argv[1:])
