"""The agent_design table: run seeds, then the best agent found vs every hand-designed agent, held out.

    python experiments/agent_design/table.py --seeds 0 1 2 --max-llm-calls 250

See ``heldout.py`` (beside this file) for what is measured and the options.
"""

import sys
from pathlib import Path

from qd.task import load_module

if __name__ == "__main__":
    heldout = load_module(Path(__file__).resolve().parent / "heldout.py", "experiments_heldout")
    heldout.main("agent_design", sys.argv[1:])
