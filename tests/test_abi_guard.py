"""The ABI guard: the checked-in descriptions in abi/ (capi/abi.py) against include/vllm.h.

- abi/vllm-<major>.<minor>.json of the header's version equals the header's description
  (regenerate with `.venv/bin/python capi/abi.py --write`);
- the header is compatible with every earlier minor of its major (nothing removed or
  changed; structs grow only at the end and only with struct_size first): an
  incompatible change fails here unless VLLM_ABI_VERSION_MAJOR is bumped;
- the layouts in the description are the C compiler's (oracle: offsetof / sizeof /
  _Alignof printed by a program cc builds from the header);
- a major bump (N.0) is deliberate: the previous major's last description is kept, and
  docs/c_api.md has a "Migrating from <old> to N.0" section naming every function,
  typedef, enum constant and struct it changed or removed;
- the rule itself flags each kind of break and accepts additions.
Ours (vLLM has no C ABI); the conventions are docs/c_api.md's.
"""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

from libvllm.capi.abi import (
    ABI_DIR,
    broken_names,
    describe,
    description_path,
    incompatibilities,
    last_of_major,
)
from libvllm.capi.header import HEADER, ROOT, abi_version


@pytest.fixture(scope="module")
def current() -> dict:
    return describe()


def test_checked_in_description_is_the_headers(current):
    path = description_path(abi_version())
    assert path.is_file(), f"{path} is missing: run .venv/bin/python capi/abi.py --write"
    assert json.loads(path.read_text()) == current, (
        f"{path.name} differs from include/vllm.h: an addition needs a minor bump "
        "(VLLM_ABI_VERSION_MINOR) and `capi/abi.py --write`")


def test_compatible_with_every_earlier_minor(current):
    major, minor = abi_version()
    earlier = [p for p in ABI_DIR.glob(f"vllm-{major}.*.json")
               if int(p.stem.split(".")[1]) < minor]
    assert earlier or minor == 0
    for path in earlier:
        problems = incompatibilities(json.loads(path.read_text()), current)
        assert not problems, (f"include/vllm.h breaks programs built against {path.name} "
                              f"without a major bump: {problems}")


def test_a_major_bump_has_a_migration_note(current):
    major, minor = abi_version()
    if major == 0 or minor != 0:
        pytest.skip("not the first minor of a major")
    previous = last_of_major(major - 1)
    assert previous is not None, f"abi/vllm-{major - 1}.*.json of the previous major is gone"
    old = json.loads(previous.read_text())
    broken = broken_names(old, current)
    assert broken, f"{previous.name} -> {major}.0 breaks nothing: no major bump needed"
    docs = (ROOT / "docs" / "c_api.md").read_text()
    old_version = ".".join(map(str, old["abi_version"]))
    heading = f"## Migrating from {old_version} to {major}.0"
    assert heading in docs, f"docs/c_api.md needs a section {heading!r}"
    note = docs.split(heading, 1)[1].split("\n## ", 1)[0]
    missing = sorted(name for name in broken if f"`{name}" not in note)
    assert not missing, f"the migration note does not name {missing}"


def test_layouts_are_the_compilers(current, tmp_path):
    lines = []
    for name, layout in current["structs"].items():
        lines.append(f'printf("{name} %zu %zu\\n", sizeof(struct {name}), '
                     f"_Alignof(struct {name}));")
        for field, *_ in layout["fields"]:
            lines.append(f'printf("{name}.{field} %zu %zu\\n", offsetof(struct {name}, {field}),'
                         f" sizeof(((struct {name} *)0)->{field}));")
    source = tmp_path / "layout.c"
    source.write_text("#include <stdio.h>\n#include <stddef.h>\n#include \"vllm.h\"\n"
                      "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", f"-I{HEADER.parent}", str(source), "-o", str(exe)],
                   check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    printed = {key: [a, b] for key, a, b in (line.split() for line in run.stdout.splitlines())}
    for name, layout in current["structs"].items():
        assert printed[name] == [str(layout["size"]), str(layout["align"])], name
        for field, _, offset, size in layout["fields"]:
            assert printed[f"{name}.{field}"] == [str(offset), str(size)], (name, field)


def _changed(description: dict, change) -> list[str]:
    new = copy.deepcopy(description)
    change(new)
    return incompatibilities(description, new)


def _fields(d: dict, struct: str) -> list:
    return d["structs"][struct]["fields"]


@pytest.mark.parametrize("change", [
    lambda d: d["functions"].pop("vllm_engine_step"),
    lambda d: d["functions"].update(vllm_tokenize="vllm_status (vllm_engine *)"),
    lambda d: d["enums"].update(VLLM_ERR_TIMEOUT=99),
    lambda d: d["enums"].pop("VLLM_FINISH_ABORT"),
    lambda d: d["typedefs"].update(vllm_status="int64_t"),
    lambda d: _fields(d, "vllm_sampling_params").insert(2, ["n", "int32_t", 8, 4]),
    lambda d: _fields(d, "vllm_event").pop(),
    lambda d: d["structs"]["vllm_request_output"].update(size=72),
    lambda d: d["structs"]["vllm_metrics"].update(size=8),
    lambda d: d["structs"]["vllm_model_info"].update(align=16),
    lambda d: d["structs"].pop("vllm_event"),
], ids=["function-removed", "prototype-changed", "enum-renumbered", "enum-removed",
        "typedef-changed", "field-inserted", "field-removed", "array-struct-grew",
        "struct-shrank", "alignment-changed", "struct-removed"])
def test_rule_flags_incompatible_changes(current, change):
    assert _changed(current, change)


def test_rule_accepts_additions(current):
    def add(d):
        d["functions"]["vllm_new_thing"] = "vllm_status (void)"
        d["enums"]["VLLM_ERR_NEW"] = 99
        d["typedefs"]["vllm_new_callback"] = "void (*)(void *)"
        size = d["structs"]["vllm_sampling_params"]["size"]
        _fields(d, "vllm_sampling_params").append(["new_field", "float", size, 4])
        d["structs"]["vllm_sampling_params"]["size"] = size + 8
        d["structs"]["vllm_new"] = {"size": 4, "align": 4, "fields": []}

    assert _changed(current, add) == []


def test_an_edited_header_without_a_major_bump_is_caught(current, tmp_path):
    text = HEADER.read_text().replace(
        "    int32_t top_k;                   /* default 0 (off) */\n", "", 1)
    header = tmp_path / "vllm.h"
    header.write_text(text)
    edited = describe(header)
    assert edited["abi_version"] == current["abi_version"]
    assert any("vllm_sampling_params" in p for p in incompatibilities(current, edited))
