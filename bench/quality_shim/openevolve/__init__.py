"""A stand-in for the one piece of OpenEvolve its example evaluators import, so qd's interpreter
(and its sandbox) runs OpenEvolve's ``function_minimization`` evaluator unchanged without the
package installed beside qd (``bench/quality_tasks.py``)."""
