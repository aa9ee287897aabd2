"""Reading a genome out of an answer: the fenced block that holds it, and Python's syntax check."""

import pytest

from genomes.answers import MalformedAnswer, check_syntax, extract_code

# ---------------------------------------------------------------- extract_code


def test_extract_single_python_block():
    assert extract_code("Here:\n```python\nx = 1\n```\nDone.") == "x = 1\n"


@pytest.mark.parametrize("tag", ["python", "py", "Python3", ""])
def test_extract_accepts_python_tags_and_untagged(tag):
    assert extract_code(f"```{tag}\nx = 1\n```") == "x = 1\n"


def test_extract_skips_other_languages():
    answer = "Run:\n```bash\npython prog.py --a-much-longer-shell-command-line\n```\n```python\nx = 1\n```"
    assert extract_code(answer) == "x = 1\n"


def test_extract_prefers_tagged_over_untagged():
    answer = "```python\nx = 1\n```\nOutput:\n```\nsome long output text that is longer than the code\n```"
    assert extract_code(answer) == "x = 1\n"


def test_extract_usage_snippet_does_not_win():
    program = "def f(x):\n    total = 0\n    for i in range(x):\n        total += i\n    return total\n"
    answer = f"```python\n{program}```\nUsage:\n```python\nprint(f(3))\n```"
    assert extract_code(answer) == program


def test_extract_later_comparable_block_wins():
    old = "def f(x):\n    return x * 2\n"
    new = "def f(x):\n    return x ** 3\n"
    assert extract_code(f"Before:\n```python\n{old}```\nAfter:\n```python\n{new}```") == new


def test_extract_truncated_answer_without_a_compiling_prefix():
    with pytest.raises(MalformedAnswer, match=r"unterminated code block \(answer truncated\?\)"):
        extract_code("```python\ndef f(x):\n    return (x +")


def test_extract_truncated_answer_keeps_its_longest_compiling_prefix():
    answer = "```python\ndef f(x):\n    return x * 2\n\nprint(f(3), f(\n  this rambles on"
    assert extract_code(answer) == "def f(x):\n    return x * 2\n"


def test_extract_truncated_output_after_a_complete_block_is_ignored():
    assert extract_code("```python\nx = 1\n```\nOutput:\n```text\n1\n2") == "x = 1\n"


@pytest.mark.parametrize("answer", ["just prose, x = 1", "```bash\nls\n```", ""])
def test_extract_no_block(answer):
    with pytest.raises(MalformedAnswer, match="no code block"):
        extract_code(answer)


def test_extract_empty_block():
    with pytest.raises(MalformedAnswer, match="empty code block"):
        extract_code("```python\n\n```")


def test_extract_inner_fence_with_info_is_content_and_indented_fence_dedents():
    assert extract_code('```python\ns = """\n```python\n"""\n```') == 's = """\n```python\n"""\n'
    assert extract_code("  ```python\n  if x:\n      y = 1\n  ```") == "if x:\n    y = 1\n"


def test_extract_other_language():
    assert (
        extract_code("```js\nlet a = 1;\n```\n```rust\nfn main() {}\n```", language="rust")
        == "fn main() {}\n"
    )


def test_check_syntax():
    check_syntax("def f():\n    return 1\n")
    with pytest.raises(MalformedAnswer, match=r"^syntax error line 2: "):
        check_syntax("x = 1\ndef f(:\n")
