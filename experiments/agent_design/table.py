"""The agent_design table: run seeds, then the best agent found vs every hand-designed agent, held out.

    python experiments/agent_design/table.py --seeds 0 1 2 --max-llm-calls 250

See ``qd.design_table`` for what is measured and the options.
"""

import sys

from qd import design_table

if __name__ == "__main__":
    design_table.main("agent_design", sys.argv[1:])
