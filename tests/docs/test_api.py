"""The public API as the reference documents it: every exported name on a reference page, and issue 32's loose ends.

Reads docstrings and signatures only (no process group, no site build): a
name added to ``polydist.__all__`` without a reference entry, a public
function whose docstring loses its Returns or Raises section, or an error type
outside ``PolydistError`` fails here; so does a front page that points outside the repository.
"""

from __future__ import annotations

import glob
import inspect
import os
import re

import pytest
import torch.distributed as dist

import polydist as pdist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "docs", "reference")


def test_every_exported_name_is_on_a_reference_page():
    text = " ".join(open(page, encoding="utf-8").read() for page in glob.glob(os.path.join(REFERENCE, "*.md")))
    missing = [name for name in pdist.__all__ if not re.search(rf"polydist\.(\w+\.)*{name}\b", text)]
    assert missing == []


def test_non_group_member_is_exported_as_torchs():
    assert "NON_GROUP_MEMBER" in pdist.__all__
    assert pdist.NON_GROUP_MEMBER is dist.GroupMember.NON_GROUP_MEMBER


@pytest.mark.parametrize("error", [getattr(pdist, name) for name in pdist.__all__ if name.endswith("Error")])
def test_every_error_is_a_polydist_error(error):
    assert issubclass(error, pdist.PolydistError)


def test_invalid_group_error_is_still_both_builtin_errors():
    """``except TypeError`` (torch.distributed's) and ``except ValueError`` (ignite's) still catch it."""
    assert issubclass(pdist.InvalidGroupError, TypeError) and issubclass(pdist.InvalidGroupError, ValueError)


def test_invalid_argument_error_is_the_value_error_of_before_and_torchs_runtime_error():
    """The Python groups' argument errors: ``except ValueError`` (as they raised) and ``except RuntimeError``
    (as torch's gloo and MPI groups raise) both catch them."""
    assert issubclass(pdist.InvalidArgumentError, ValueError) and issubclass(pdist.InvalidArgumentError, RuntimeError)


@pytest.mark.parametrize("name", ["isend", "irecv", "recv", "all_reduce", "broadcast", "all_gather", "spawn"])
def test_public_functions_say_what_they_return_and_raise(name):
    doc = inspect.getdoc(getattr(pdist, name))
    assert "\nReturns:\n" in doc and "\nRaises:\n" in doc


def test_parallel_documents_each_parameter():
    doc = inspect.getdoc(pdist.Parallel)
    args = doc.split("\nArgs:\n", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^ {4}(\**\w+):", args, re.M)
    parameters = [("**" if p.kind is p.VAR_KEYWORD else "") + p.name
                  for p in inspect.signature(pdist.Parallel).parameters.values()]
    assert documented == parameters and len(parameters) == 8


def test_new_group_says_it_may_return_a_list():
    """Serially ``new_group`` returns the rank list itself (as ignite's); the annotation says so."""
    assert "list[int]" in str(inspect.signature(pdist.new_group).return_annotation)
    assert pdist.new_group([0]) == [0]


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_front_pages_point_to_the_architecture_page(page):
    """Not to a design file outside the repository, which a user of it does not have."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    assert "DESIGN.md" not in text and "architecture.md" in text and "contributing.md" in text


def test_every_op_spelling_is_accepted_documented_and_listed_when_refused():
    """The op names ``resolve_op`` accepts are the reference's table, and a refused name lists them all."""
    from polydist import ops

    section = open(os.path.join(REFERENCE, "collectives.md"), encoding="utf-8").read().split("## Reduce ops", 1)[1]
    rows = {row.split("|")[1].strip(): row for row in re.findall(r"^\|.*\|$", section.split("\n#", 1)[0], re.M)[2:]}
    with pytest.raises(ValueError) as refused:
        ops.resolve_op("MEDIAN")
    for name, spellings in ops.SPELLINGS.items():
        row = next(row for first, row in rows.items() if f'"{name}"' in first)
        for spelling in spellings:
            assert ops.resolve_op(spelling.lower()) == name
            assert f'"{spelling}"' in row and repr(spelling) in str(refused.value)
