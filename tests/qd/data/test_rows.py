"""Every source a user keeps rows in loads the same rows; a missing column is one line."""

import csv
import json

import pytest

from qd.contract import ConfigError
from qd.data import load_rows

ROWS = [
    {"id": f"r{i}", "input": f"What is {i} + {i}?", "answer": str(2 * i), "topic": "sum"} for i in range(10)
]


def as_tuples(rows):
    return [(r.id, r.input, str(r.answer)) for r in rows]


def write(tmp_path, kind):
    path = tmp_path / f"rows.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
            writer.writeheader()
            writer.writerows(ROWS)
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        import datasets

        path = tmp_path / "rows_folder"
        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "datasets"])
def test_each_source_loads_the_same_ten_rows(tmp_path, kind):
    rows = load_rows(write(tmp_path, kind))
    assert as_tuples(rows) == as_tuples(load_rows(ROWS))
    assert len(rows) == 10 and rows[3].fields["topic"] == "sum"


def test_named_columns_and_positional_ids():
    rows = load_rows([{"q": "2+2?", "a": 4}, {"q": "3+3?", "a": 6}], input="q", answer="a")
    assert [(r.id, r.input, r.answer) for r in rows] == [("0", "2+2?", 4), ("1", "3+3?", 6)]


def test_a_shipped_sample_loads_by_name():
    rows = load_rows("arith60")
    assert (
        len(rows) == 60
        and len({r.id for r in rows}) == 60
        and all(r.answer.lstrip("-").isdigit() for r in rows)
    )


@pytest.mark.parametrize(
    "kwargs, field, says",
    [
        ({"input": "question"}, "input", "no column 'question'"),
        ({"answer": "label"}, "answer", "no column 'label'"),
    ],
)
def test_a_missing_column_is_one_line_naming_the_argument(kwargs, field, says):
    with pytest.raises(ConfigError) as e:
        load_rows(ROWS, **kwargs)
    message = str(e.value)
    assert e.value.field == field and says in message and "\n" not in message and f"{field}=" in message


@pytest.mark.parametrize("source", [[], "no/such/file.jsonl", 42, {"input": "x"}])
def test_what_is_not_a_dataset_is_refused_in_one_line(source):
    with pytest.raises(ConfigError) as e:
        load_rows(source)
    assert e.value.field == "dataset" and "\n" not in str(e.value)


def test_an_unknown_format_names_the_known_ones(tmp_path):
    path = tmp_path / "rows.xlsx"
    path.write_text("x")
    with pytest.raises(ConfigError, match=r"\.jsonl.*\.csv.*\.parquet"):
        load_rows(path)


def test_the_shipped_sample_is_what_its_generator_makes():
    from qd.reasoning.problems import problems

    made = [(p.id, p.question, p.answer) for p in problems("search", 60, seed=28, families=("arithmetic",))]
    assert as_tuples(load_rows("arith60")) == made


def test_loaded_rows_load_as_they_are():
    rows = load_rows(ROWS)
    assert load_rows(rows) is rows


@pytest.mark.parametrize("kind", ["parquet", "datasets"])
def test_parquet_and_datasets_without_the_export_extra_is_one_line(tmp_path, monkeypatch, kind):
    import importlib.util

    from qd import extras

    path = write(tmp_path, kind)
    found = importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util, "find_spec", lambda name: None if name == "pyarrow" else found(name)
    )
    with pytest.raises(extras.MissingExtra) as e:
        load_rows(path)
    assert 'pip install "qd-engine[export]"' in str(e.value) and "\n" not in str(e.value)
