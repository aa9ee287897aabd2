"""Turning answers into programs: code blocks, EVOLVE-BLOCK regions, SEARCH/REPLACE diffs."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genomes.answers import MalformedAnswer
from operators.code import MarkerError, evolvable_regions, layout, rebuild
from operators.diff import DiffBlock, DiffError, apply_diff, parse_diff

MARKED = """import math

def score(x):
    # EVOLVE-BLOCK-START
    y = x * 2
    return y
    # EVOLVE-BLOCK-END


def main():
    print(score(3))
"""

TWO_REGIONS = """# EVOLVE-BLOCK-START
A = 1
# EVOLVE-BLOCK-END
def keep():
    return A
# EVOLVE-BLOCK-START
B = 2
# EVOLVE-BLOCK-END
"""


def frozen_lines(text: str) -> tuple[str, ...]:
    return layout(text).frozen


# ---------------------------------------------------------------- EVOLVE-BLOCK regions


def test_layout_splits_and_joins():
    lay = layout(MARKED)
    assert lay.marked and lay.evolvable == ("    y = x * 2\n    return y\n",)
    assert lay.join(lay.evolvable) == MARKED
    ((start, end),) = lay.spans()
    assert MARKED[start:end] == lay.evolvable[0]
    assert evolvable_regions(TWO_REGIONS) == ["A = 1\n", "B = 2\n"]


def test_unmarked_program_is_all_evolvable():
    assert evolvable_regions("x = 1\n") == ["x = 1\n"]
    assert rebuild("x = 1\n", "y = 2\n") == "y = 2\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("# EVOLVE-BLOCK-START\nx\n# EVOLVE-BLOCK-START\n# EVOLVE-BLOCK-END\n", "line 3: nested"),
        ("x\n# EVOLVE-BLOCK-END\n", "line 2: EVOLVE-BLOCK-END without"),
        ("x\n# EVOLVE-BLOCK-START\ny\n", "line 2: EVOLVE-BLOCK-START is never closed"),
        ("# EVOLVE-BLOCK-START EVOLVE-BLOCK-END\n", "line 1: .* on one line"),
    ],
)
def test_broken_markers_in_parent_are_a_clear_error(text, message):
    with pytest.raises(MarkerError, match=message):
        layout(text)
    with pytest.raises(MarkerError, match=message):
        rebuild(text, "x = 1\n")


def test_rebuild_from_whole_program_keeps_frozen_code():
    answer = MARKED.replace("x * 2", "x * 5").replace("import math", "import os  # frozen, must be dropped")
    child = rebuild(MARKED, answer)
    assert child == MARKED.replace("x * 2", "x * 5")


def test_rebuild_from_region_only_answer_reindents():
    child = rebuild(MARKED, "y = x + 1\nreturn y\n")
    assert child == MARKED.replace("y = x * 2", "y = x + 1")


def test_rebuild_whole_program_without_markers():
    answer = "import math\n\ndef score(x):\n  z = x - 1\n  return z\n\n\ndef main():\n    print(score(3))\n"
    child = rebuild(MARKED, answer)
    assert layout(child).evolvable == ("    z = x - 1\n    return z\n\n\n",)
    assert frozen_lines(child) == frozen_lines(MARKED)


def test_rebuild_two_regions():
    answer = TWO_REGIONS.replace("A = 1", "A = 10").replace("B = 2", "B = 20")
    assert rebuild(TWO_REGIONS, answer) == answer
    without_markers = "A = 11\ndef keep():\n    return A\nB = 22\n"
    assert evolvable_regions(rebuild(TWO_REGIONS, without_markers)) == ["A = 11\n", "B = 22\n"]


@pytest.mark.parametrize(
    "answer, message",
    [
        (
            "# EVOLVE-BLOCK-START\nA = 1\n# EVOLVE-BLOCK-END\n",
            "answer has 1 EVOLVE-BLOCK regions, the parent has 2",
        ),
        ("A = 5\nB = 6\n", "changes the frozen code|no markers"),
        ("A = 5\n# EVOLVE-BLOCK-END\n", "broken EVOLVE-BLOCK markers"),
    ],
)
def test_rebuild_rejects_what_cannot_be_repaired(answer, message):
    with pytest.raises(MalformedAnswer, match=message):
        rebuild(TWO_REGIONS, answer)


def test_rebuild_rejects_rewritten_frozen_code_without_markers():
    answer = (
        "import math\n\ndef score(x):\n    return x * 9\n\n\ndef main():\n    print('changed', score(3))\n"
    )
    with pytest.raises(MalformedAnswer, match="frozen code"):
        rebuild(MARKED, answer)


_line = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Zl", "Zp", "Cc")), max_size=20),  # no line breaks
    st.sampled_from(
        [
            "# EVOLVE-BLOCK-START",
            "# EVOLVE-BLOCK-END",
            "import math",
            "def score(x):",
            "    return y",
            "def main():",
            "    print(score(3))",
            "",
            "    y = x * 2",
            "def keep():",
            "    return A",
        ]
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parent=st.sampled_from([MARKED, TWO_REGIONS]), answer=st.lists(_line, max_size=14).map("\n".join))
def test_property_frozen_lines_survive_any_answer(parent, answer):
    try:
        child = rebuild(parent, answer)
    except MalformedAnswer:
        return
    assert frozen_lines(child) == frozen_lines(parent)
    frozen = "".join(frozen_lines(parent))
    assert all(line in child.splitlines(keepends=True) for line in frozen.splitlines(keepends=True))


# ---------------------------------------------------------------- diff parsing


def test_parse_tolerates_marker_variants():
    answer = (
        "Sure!\n<<<<<<<SEARCH\na\n  =====  \nb\n>>>>>  replace\n"
        "\n<<<<<<<<< search\nc\n=========\n>>>>>>>>>REPLACE\n"
    )
    assert parse_diff(answer) == [DiffBlock("a\n", "b\n"), DiffBlock("c\n", "")]


def test_parse_errors():
    with pytest.raises(DiffError, match="no SEARCH/REPLACE blocks"):
        parse_diff("```python\nx = 1\n```")
    with pytest.raises(DiffError, match=r"block 2: no >>>>>>> REPLACE line .*truncated"):
        parse_diff("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n<<<<<<< SEARCH\nc\n=======\nd\n")
    with pytest.raises(DiffError, match="block 1: no ======= line"):
        parse_diff("<<<<<<< SEARCH\na\n")


# ---------------------------------------------------------------- applying


PROGRAM = "def f(x):\n    if x > 0:\n        return x * 2\n    return 0\n"


def test_apply_exact():
    out = apply_diff(PROGRAM, [DiffBlock("        return x * 2\n", "        return x * 3\n")])
    assert out == PROGRAM.replace("x * 2", "x * 3")


def test_apply_blocks_in_sequence():
    blocks = [DiffBlock("    return 0\n", "    return -1\n"), DiffBlock("    return -1\n", "    return -2\n")]
    assert apply_diff(PROGRAM, blocks).endswith("    return -2\n")


def test_apply_whitespace_insensitive_reindents_replacement():
    block = DiffBlock("if x  >  0:\n    return x * 2\n", "if x > 1:\n    y = x * 3\n    return y\n")
    out = apply_diff(PROGRAM, [block])
    assert out == "def f(x):\n    if x > 1:\n        y = x * 3\n        return y\n    return 0\n"


def test_apply_whitespace_insensitive_dedents_when_quoted_deeper():
    replace = "            if x < -5:\n                return 1\n            return 0\n"
    block = DiffBlock("            return 0\n", replace)
    out = apply_diff(PROGRAM, [block])
    assert out.endswith("    if x < -5:\n        return 1\n    return 0\n")


def test_apply_fuzzy():
    block = DiffBlock("    if x >= 0:\n        return x*2\n", "    if x > 0:\n        return x * 4\n")
    assert apply_diff(PROGRAM, [block]) == PROGRAM.replace("x * 2", "x * 4")


def test_apply_fuzzy_respects_threshold():
    block = DiffBlock("    while y < 10:\n        yield y\n", "    pass\n")
    with pytest.raises(DiffError, match=r"^block 1 of 1: SEARCH text not found \(first line 'while y < 10:'"):
        apply_diff(PROGRAM, [block])
    strict = DiffBlock("    if x >= 0:\n        return x*2\n", "pass\n")
    with pytest.raises(DiffError, match="not found"):
        apply_diff(PROGRAM, [strict], threshold=0.99)


def test_apply_fuzzy_tie_is_ambiguous():
    text = "a = compute(1)\nb = 0\na = compute(2)\nb = 0\n"
    with pytest.raises(DiffError, match=r"block 1 of 1: .*several places.*lines 1, 3"):
        apply_diff(text, [DiffBlock("a = compute(9)\nb = 0\n", "a = 5\n")])


def test_apply_exact_duplicate_edits_first_occurrence():
    text = "x = 1\ny = 2\nx = 1\n"
    assert apply_diff(text, [DiffBlock("x = 1\n", "x = 9\n")]) == "x = 9\ny = 2\nx = 1\n"


def test_apply_not_found_names_the_block():
    blocks = [
        DiffBlock("    return 0\n", "    return 1\n"),
        DiffBlock("totally different\ncontent here\n", ""),
    ]
    with pytest.raises(DiffError, match=r"^block 2 of 2: SEARCH text not found"):
        apply_diff(PROGRAM, blocks)


def test_apply_empty_search():
    with pytest.raises(DiffError, match="block 1 of 1: empty SEARCH"):
        apply_diff(PROGRAM, [DiffBlock("\n", "x = 1\n")])


def test_apply_outside_regions_is_rejected():
    spans = layout(MARKED).spans()
    with pytest.raises(DiffError, match="block 1 of 1: SEARCH text is in the frozen code"):
        apply_diff(MARKED, [DiffBlock("import math\n", "import os\n")], allowed_regions=spans)
    with pytest.raises(DiffError, match="frozen code"):  # the marker line itself is frozen
        apply_diff(MARKED, [DiffBlock("    # EVOLVE-BLOCK-END\n", "")], allowed_regions=spans)
    with pytest.raises(DiffError, match=r"\(ignoring whitespace\) is in the frozen code"):
        apply_diff(MARKED, [DiffBlock("def   main():\n", "def run():\n")], allowed_regions=spans)


def test_apply_prefers_the_occurrence_inside_a_region():
    text = "# EVOLVE-BLOCK-START\nx = 1\n# EVOLVE-BLOCK-END\nx = 1\n"
    out = apply_diff(text, [DiffBlock("x = 1\n", "x = 2\n")], allowed_regions=layout(text).spans())
    assert out == "# EVOLVE-BLOCK-START\nx = 2\n# EVOLVE-BLOCK-END\nx = 1\n"


def test_apply_tracks_regions_as_text_shifts():
    blocks = [DiffBlock("A = 1\n", "A = 1\nA2 = 11\nA3 = 111\n"), DiffBlock("B = 2\n", "B = 3\n")]
    out = apply_diff(TWO_REGIONS, blocks, allowed_regions=layout(TWO_REGIONS).spans())
    assert evolvable_regions(out) == ["A = 1\nA2 = 11\nA3 = 111\n", "B = 3\n"]
    with pytest.raises(DiffError, match="block 2 of 2: .*frozen"):
        apply_diff(
            TWO_REGIONS,
            [blocks[0], DiffBlock("def keep():\n", "def kept():\n")],
            allowed_regions=layout(TWO_REGIONS).spans(),
        )


_code_line = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12).map(str.rstrip)


@settings(max_examples=200, deadline=None)
@given(region=st.lists(_code_line, min_size=1, max_size=6), new=st.lists(_code_line, max_size=6))
def test_property_diff_round_trip_replaces_region_in_place(region, new):
    region_text = "".join(line + "\n" for line in region)
    if not region_text.strip():
        return
    program = f"head = 0\n# EVOLVE-BLOCK-START\n{region_text}# EVOLVE-BLOCK-END\ntail = 1\n"
    new_text = "".join(line + "\n" for line in new)
    out = apply_diff(program, [DiffBlock(region_text, new_text)], allowed_regions=layout(program).spans())
    assert out == f"head = 0\n# EVOLVE-BLOCK-START\n{new_text}# EVOLVE-BLOCK-END\ntail = 1\n"


@st.composite
def _quoted_lines(draw):
    """A slice of MARKED's lines, sometimes re-spaced or edited, as a weak model would quote it."""
    lines = MARKED.splitlines()
    start = draw(st.integers(0, len(lines) - 1))
    quoted = lines[start : draw(st.integers(start + 1, len(lines)))]
    if draw(st.booleans()):
        quoted = [("  " + line.strip()) if line.strip() else line for line in quoted]
    if draw(st.booleans()):
        quoted = [line.replace("x", "z") for line in quoted]
    return "".join(line + "\n" for line in quoted)


@settings(max_examples=200, deadline=None)
@given(
    search=_quoted_lines(), replace=st.lists(_line, max_size=4).map(lambda ls: "".join(s + "\n" for s in ls))
)
def test_property_diff_never_touches_frozen_code(search, replace):
    head, tail = layout(MARKED).frozen
    try:
        out = apply_diff(MARKED, [DiffBlock(search, replace)], allowed_regions=layout(MARKED).spans())
    except DiffError:
        return
    assert out.startswith(head) and out.endswith(tail) and len(out) >= len(head) + len(tail)
