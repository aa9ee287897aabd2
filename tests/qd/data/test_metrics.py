"""Each metric scores a fixed table of (row, output) pairs; a bad metric is one line."""

import pytest

from qd.contract import ConfigError
from qd.data import Row, metric_of


def row(answer, **fields):
    return Row("0", "question", answer, {"input": "question", "answer": answer, **fields})


OPTIONS = ["Paris", "Rome", "Madrid", "Berlin"]
TABLE = [
    # metric, options, row, output, score
    ("exact", {}, row("17"), "17", 1.0),
    ("exact", {}, row("17"), "Let me think.\nAnswer: 17.", 1.0),
    ("exact", {}, row("Paris"), "answer: paris", 1.0),
    ("exact", {}, row("17"), "Answer: 171", 0.0),
    ("exact", {}, row("17"), "17 apples, I think", 0.0),
    ("contains", {}, row("blue whale"), "The largest animal is the Blue  Whale.", 1.0),
    ("contains", {}, row("blue whale"), "An elephant.", 0.0),
    ("numeric", {}, row("12"), "12 apples", 1.0),
    ("numeric", {}, row("12"), "3 bags of 4 make 12.0", 1.0),
    ("numeric", {}, row("1,200"), "Answer: 1200", 1.0),
    ("numeric", {}, row("12"), "Answer: 13", 0.0),
    ("numeric", {}, row("12"), "twelve", 0.0),
    ("numeric", {"tolerance": 0.5}, row("3.14"), "about 3.5", 1.0),
    ("numeric", {"tolerance": 0.1}, row("3.14"), "about 3.5", 0.0),
    ("numeric", {"tolerance": 0.01, "relative": True}, row("1000"), "Answer: 1009", 1.0),
    ("numeric", {"tolerance": 0.01, "relative": True}, row("1000"), "Answer: 1011", 0.0),
    ("regex", {}, row(r"\bknight\b.*\bknave\b"), "A: Knight, B: knave", 1.0),
    ("regex", {"ignore_case": False}, row(r"\bknight\b"), "A: Knight", 0.0),
    ("choice", {}, row("B", options=OPTIONS), "Answer: (B)", 1.0),
    ("choice", {}, row("B", options=OPTIONS), "I would say Rome.", 1.0),
    ("choice", {}, row("Rome", options=OPTIONS), "Answer: B", 1.0),
    ("choice", {}, row("B", options=OPTIONS), "Answer: C", 0.0),
    ("choice", {}, row("B", options=OPTIONS), "Madrid, clearly.", 0.0),
    ("choice", {"options": "choices"}, row("D", choices=OPTIONS), "Berlin", 1.0),
]


@pytest.mark.parametrize("name, options, r, output, score", TABLE)
def test_each_metric_scores_the_table(name, options, r, output, score):
    assert metric_of(name, **options)(r, output).score == score


def test_a_callable_metric_gets_the_row_dict_and_may_give_feedback():
    def longer(r, output):
        return {"score": min(1.0, len(output) / r["target"]), "feedback": f"wanted {r['target']} chars"}

    verdict = metric_of(longer)(row("x", target=10), "12345")
    assert verdict.score == 0.5 and verdict.feedback == "wanted 10 chars"
    assert metric_of(lambda r, output: output == r["answer"])(row("x"), "x").score == 1.0


def test_a_callable_metric_returning_no_number_says_what_to_return():
    with pytest.raises(ValueError, match="finite number, or a dict with 'score'"):
        metric_of(lambda r, output: "yes")(row("x"), "x")


@pytest.mark.parametrize(
    "metric, options, says",
    [
        ("fuzzy", {}, "unknown metric 'fuzzy'"),
        (3, {}, "a int is not a metric"),
        ("exact", {"tolerance": 1}, "exact has no option 'tolerance'"),
        ("numeric", {"tol": 1}, "numeric has no option 'tol'"),
    ],
)
def test_a_bad_metric_is_one_line_naming_the_fix(metric, options, says):
    with pytest.raises(ConfigError) as e:
        metric_of(metric, **options)
    assert e.value.field == "metric" and says in str(e.value) and e.value.fix and "\n" not in str(e.value)
