"""benchmarks/RESULTS.md opens with "Results at a glance", one row per goal, and the table can be trusted:
every row links a heading of the file (GitHub's anchors, repeats numbered -1, -2), and every number of its
"today" cell (1.06x, x0.68, 2759 s, 17.2%, 0.31) appears verbatim in the section it links to, from that
heading to the next "## " heading. A number copied wrong, or a link to the wrong section, fails here."""
import re

from conftest import ROOT

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
NUMBER = re.compile(r"(?<![\w.=])x?\d+(?:,\d{3})*(?:\.\d+)?(?:x|%| s\b)?(?!\w|\.\d)")  # not k=1, 0.3M, 8x4


def sections(text: str) -> dict[str, str]:
    """GitHub's anchor of every '## ' heading -> the text from it to the next '## ' heading."""
    out, seen = {}, {}
    for part in re.split(r"^(?=## )", text, flags=re.M)[1:]:
        slug = re.sub(r"[^\w\- ]", "", part.split("\n", 1)[0][3:].strip().lower()).replace(" ", "-")
        out[f"{slug}-{seen[slug]}" if slug in seen else slug] = part
        seen[slug] = seen.get(slug, 0) + 1
    return out


def glance_rows(text: str) -> list[dict[str, str]]:
    """The rows of the 'Results at a glance' table, as {column: cell}."""
    table = re.search(r"^## Results at a glance\n.*?\n(\|.*?)\n\n", text, re.S | re.M).group(1)
    header, _, *rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in table.splitlines()]
    return [dict(zip(header, row)) for row in rows]


def problems(rows: list[dict[str, str]], text: str) -> list[str]:
    found, by_anchor = [], sections(text)
    for row in rows:
        anchor = re.fullmatch(r"\[[^\]]+\]\(#([^)]+)\)", row["section"])
        if not anchor or anchor.group(1) not in by_anchor:
            found.append(f"{row['goal']}: no heading for {row['section']}")
            continue
        body = by_anchor[anchor.group(1)]
        found += [f"{row['goal']}: {n} not in its section" for n in NUMBER.findall(row["today"]) if n not in body]
    return found


def test_the_table_covers_the_goals():
    text = RESULTS.read_text()
    assert text.index("## Results at a glance") < text.index("(2026-11-21)")  # before the first dated section
    rows = glance_rows(text)
    assert len(rows) >= 30 and all(r["command"].startswith("`") and r["machine"] for r in rows)
    goals = " ".join(r["goal"] for r in rows)
    for goal in ["demo step", "packed", "logits", "bare engine", "scaling", "weight sync", "TRL", "sandbox",
                 "continuous vs lockstep", "LoRA", "split k=1", "stream", "on paper", "algorithms",
                 "endpoint", "prefix cache", "make demo", "make test"]:
        assert goal in goals, goal


def test_every_link_and_number_is_in_its_section():
    text = RESULTS.read_text()
    assert problems(glance_rows(text), text) == []


def test_the_check_can_fail():
    text = RESULTS.read_text()
    demo = "#rlcore-vs-trl-grpotrainer-demo-2026-11-22"
    made_up = [{"goal": "made up", "today": "x1.26 and x9.99 (17.2%)", "section": f"[demo]({demo})"},
               {"goal": "no such section", "today": "x1.26", "section": f"[demo]({demo}-9)"}]
    assert problems(made_up, text) == ["made up: x9.99 not in its section", "made up: 17.2% not in its section",
                                       f"no such section: no heading for [demo]({demo}-9)"]
    assert "a-b-1" in sections("## A b\n## A b\n")  # repeats numbered as GitHub does


def test_the_on_paper_model_by_hand():
    """benchmarks/async_paper.py's formulas on 8 GPUs, phi = 0.6, 60 s generation + 40 s training, 0.12 s transfer,
    worked by hand. Split k=1, R engines: max(60 x (0.6 x 8 / R + 0.4), 40 x 8 / (8 - R)) + 0.12, best at R=4:
    max(96, 80) = 96. Streaming k=2 at occupancy 0.8, no freeze, lag 1.25 trainer steps: max(60 x 0.6 x 8 / R / 0.8,
    40 x 8 / (8 - R), (60 x 0.4 + 1.25 x t) / 3), best at R=4: max(90, 80, 41.3) = 90; with a 0.5 freeze at R=4
    90 + 40 = 130 > R=5's max(72 + 53.3, 106.7, 52.4) = 125.3."""
    import sys
    sys.path.insert(0, str(ROOT))
    from benchmarks.async_paper import on_paper
    (row,) = on_paper(60.0, 40.0, {8: 0.12}, {8: 0.12}, [0.6], occupancy=0.8, frozen={1: 0.0, 2: 0.0})
    assert (row["Rk1"], row["Rs2"]) == (4, 4)
    assert abs(row["k1"] - 96.12) < 1e-9 and abs(row["s2"] - 90.12) < 1e-9
    (row,) = on_paper(60.0, 40.0, {8: 0.12}, {8: 0.12}, [0.6], occupancy=0.8, frozen={2: 0.5})
    assert row["Rs2"] == 5 and abs(row["s2"] - (72 + 0.5 * 320 / 3 + 0.12)) < 1e-9
    (row,) = on_paper(60.0, 40.0, {8: 0.12}, {8: 0.12}, [0.25], occupancy=1.0, frozen={1: 0.0}, lag=2.0)
    # k=1, R engines: max(60 x 0.25 x 8 / R, 320 / (8 - R), (45 + 2 x 320 / (8 - R)) / 2): R=3 max(40, 64, 86.5)
    # = 86.5, R=2 max(60, 53.3, 75.8) = 75.8, R=1 max(120, 45.7, 68.2) = 120: the chain picks R=2
    assert row["Rs1"] == 2 and abs(row["s1"] - ((45 + 2 * 320 / 6) / 2 + 0.12)) < 1e-9
    # the trainers' period 1.1 x their step (deterministic loads where something waits), occupancy 1: streaming
    # k=2 at R engines max(288 / R, 1.1 x 320 / (8 - R), chain): R=4 max(72, 88, 41.3) = 88, R=3 max(96, 70.4) = 96
    (row,) = on_paper(60.0, 40.0, {8: 0.12}, {8: 0.12}, [0.6], occupancy=1.0, frozen={2: 0.0}, period=1.1)
    assert row["Rs2"] == 4 and abs(row["s2"] - 88.12) < 1e-9
