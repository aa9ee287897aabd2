"""The prompt_evolution table: run seeds, then the best prompt found vs every hand-written prompt, held out.

    python experiments/prompt_evolution/table.py --seeds 0 1 2 --max-llm-calls 250

See ``qd.design_table`` for what is measured and the options.
"""

import sys

from qd import design_table

if __name__ == "__main__":
    design_table.main("prompt_evolution", sys.argv[1:])
