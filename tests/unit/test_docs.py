"""docs/ stays true: every relative link of README.md and docs/ leads somewhere, and the examples of
docs/formats.md are what the code reads and writes (each parses; the schedules are the ones the
generators build for the plans shown)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pipetrain.cluster import Cluster
from pipetrain.cluster_spec import parse_cluster_spec
from pipetrain.plan.plan import Plan
from pipetrain.profile.table import Profile
from pipetrain.runtime.job.metrics import METRICS_HEADER
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.timeline import Timeline

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "BENCHMARKS.md",
         ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks" / "history").glob("*.md"))]
FORMATS = ROOT / "docs" / "formats.md"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def blocks(page: Path, language: str) -> list[str]:
    """The text of every fenced block of ``page`` in ``language`` (``""``: blocks without one)."""
    found, current, body = [], None, list[str]()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            if current is None:
                current, body = line[3:].strip(), []
            else:
                if current == language:
                    found.append("\n".join(body) + "\n")
                current = None
        elif current is not None:
            body.append(line)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_somewhere(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (fragment and linked.suffix == ".md" and fragment not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{page.name}: links that lead nowhere: {broken}"


def test_no_references_to_files_users_do_not_have() -> None:
    sources = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("pipetrain/**/*.py"),
               *ROOT.glob("examples/**/*.*")]
    stale = [str(p.relative_to(ROOT)) for p in sources if re.search(r"PAPERS\.md|DESIGN\.md", p.read_text())]
    assert not stale, f"cite docs/algorithms.md or docs/architecture.md instead, in: {stale}"


def test_json_examples_parse() -> None:
    readers = {"stages": Plan.from_json, "fingerprint": Profile.from_json, "devices": Cluster.from_json,
               "events": Timeline.from_json}
    parsed = 0
    for text in blocks(FORMATS, "json"):
        if not text.startswith("{\n"):
            continue  # a fragment, checked by test_schedule_examples_are_generated
        key = next(k for k in readers if k in json.loads(text))
        readers[key](text)
        parsed += 1
    assert parsed == 5  # profile, cluster, plan, predicted and measured timelines


def test_schedule_examples_are_generated() -> None:
    """The CSV schedules shown are build_schedule's for the 1f1b plan shown and for the uedp stages shown."""
    plan_text = next(t for t in blocks(FORMATS, "json") if '"stages"' in t and t.startswith("{\n"))
    plan = Plan.from_json(plan_text)
    fragment = next(t for t in blocks(FORMATS, "json") if t.startswith('{"layers"'))
    stages = json.loads("[" + fragment.strip().rstrip(",") + "]")
    uedp = Plan.from_json(json.dumps({**json.loads(plan_text), "method": "uedp", "stages": stages}))
    shown = [Schedule.from_csv(t) for t in blocks(FORMATS, "") if re.match(r"\dF0\[", t)]
    assert shown == [build_schedule(plan), build_schedule(uedp)]


def test_cluster_yaml_example_is_the_file() -> None:
    text = blocks(FORMATS, "yaml")[0]
    name = parse_cluster_spec(text).cluster.name
    assert yaml.safe_load(text) == yaml.safe_load((ROOT / "examples" / "clusters" / f"{name}.yaml").read_text())


def test_metrics_example_has_the_header() -> None:
    text = next(t for t in blocks(FORMATS, "") if t.startswith("step,"))
    assert tuple(text.splitlines()[0].split(",")) == METRICS_HEADER
