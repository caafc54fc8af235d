"""Notes: front matter, wikilinks located by line, which notes belong to which model, and the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swaplab.notes.folder import Note, NotesError, load_notes
from swaplab.notes.matching import LinkTargets, broken_links, match_reason, mentions
from swaplab.notes.wikilinks import find_wikilinks, render

FIXTURES = Path(__file__).parent / "fixtures"
SEED_CONFIG = FIXTURES / "seed-glm-flash.yaml"
SEED_NOTES = FIXTURES / "notes"


def swaplab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swaplab", *args], capture_output=True, text=True, timeout=60)


def note(stem: str, body: str = "", models: tuple[str, ...] = (), title: str = "") -> Note:
    return Note(path=Path(f"{stem}.md"), stem=stem, title=title or stem, models=models, body=body)


SEED_NAMES = ("glm-flash-sglang", "glm-4.7-flash-sglang-tp2")


@pytest.mark.parametrize(
    ("candidate", "reason"),
    [
        (note("anything", models=("glm-4.7-flash-sglang-tp2",)), "front matter lists glm-4.7-flash-sglang-tp2"),
        (note("glm-flash-sglang"), "file name is glm-flash-sglang"),
        # The seed's case: the note's stem is a prefix of the alias, at a `-`.
        (note("glm-4.7-flash"), "file name is a prefix of glm-4.7-flash-sglang-tp2"),
        (note("glm-flash"), "file name is a prefix of glm-flash-sglang"),
        (note("glm-fl"), None),  # a prefix, but not at a `-`
        (note("glm-4.7-flash-sglang-tp2-notes"), None),  # the name is a prefix of the stem, not the other way
        (note("misc", "We moved glm-flash-sglang to GPU 1."), "mentions glm-flash-sglang"),
        (note("misc", "(see glm-4.7-flash-sglang-tp2)"), "mentions glm-4.7-flash-sglang-tp2"),
        (note("misc", "The glm-flash-sglang-old entry is gone."), None),  # `-` belongs to the token
        (note("misc", "See auto-memory/glm-flash-sglang.md for it."), None),  # so does `.` inside a token
        (note("misc", "xglm-flash-sglang"), None),
        (note("misc", "Case matters: GLM-FLASH-SGLANG."), None),
    ],
)
def test_which_notes_belong_to_a_model(candidate, reason):
    assert match_reason(candidate, SEED_NAMES) == reason


def test_a_whole_token_may_end_a_sentence_or_sit_in_brackets():
    assert mentions("Benchmarked glm-flash.", "glm-flash")
    assert mentions("[[glm-flash]]", "glm-flash")
    assert mentions("`glm-flash`, then", "glm-flash")
    assert not mentions("glm-flash-awq", "glm-flash")
    assert not mentions("glm-flash.md", "glm-flash")
    assert not mentions("v1.glm-flash", "glm-flash")


def test_front_matter_is_read_and_lines_count_from_the_top_of_the_file(tmp_path):
    (tmp_path / "a.md").write_text(
        "---\ntitle: The A note\nmodels: [m1, m2]\ntags: solo\n---\nfirst line\n\nsee [[b]] and `[[not-a-link]]`\n"
    )
    (tmp_path / "b.md").write_text("no front matter [[a|the A note]]\n")
    (tmp_path / "ignored.txt").write_text("[[nothing]]\n")
    a, b = load_notes(tmp_path)
    assert (a.stem, a.title, a.models, a.tags, a.body_line) == ("a", "The A note", ("m1", "m2"), ("solo",), 6)
    assert b.title == "b" and b.body_line == 1
    assert [(link.target, link.label, link.line) for link in find_wikilinks(a.body)] == [("b", "b", 3)]
    assert [(link.target, link.label) for link in find_wikilinks(b.body)] == [("a", "the A note")]


def test_wikilinks_render_as_links_or_visibly_broken_never_as_raw_html():
    html = render("see [[a|the A note]], [[gone]] and <b>[[a]]</b>", lambda name: "a.html" if name == "a" else None)
    assert '<a class="wikilink" href="a.html">the A note</a>' in html
    assert '<span class="wikilink broken" title="no note or model named gone">[[gone]]</span>' in html
    assert "<b>" not in html and "&lt;b&gt;" in html  # raw HTML in a note is shown, not obeyed


def test_links_name_notes_by_stem_or_title_then_models():
    notes = [note("vram-spend-priority", title="Spend VRAM on KV")]
    targets = LinkTargets(notes, {"glm-flash-sglang": "glm-flash-sglang", "glm-4.7-flash-sglang-tp2": "glm-flash-sglang"})
    assert targets.note("vram-spend-priority") is notes[0]
    assert targets.note("Spend VRAM on KV") is notes[0]
    assert targets.model("glm-4.7-flash-sglang-tp2") == "glm-flash-sglang"
    assert not targets.resolves("gpt-oss-20b")


def test_the_seed_note_has_one_broken_link():
    notes = load_notes(SEED_NOTES)
    broken = broken_links(notes, LinkTargets(notes))
    assert [(link.path.name, link.line, link.target) for link in broken] == [("glm-4.7-flash.md", 26, "gpt-oss-20b")]


def test_notes_check_locates_every_broken_link_and_exits_1(tmp_path):
    (tmp_path / "alpha.md").write_text("---\ntitle: Alpha\n---\nIntro.\n\nSee [[beta]] and [[missing-one]].\n")
    (tmp_path / "beta.md").write_text("Back to [[Alpha]].\n\n- a list\n- with [[missing-two|a label]]\n")
    result = swaplab("notes", "check", str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"{tmp_path / 'alpha.md'}:6: [[missing-one]] has no note",
        f"{tmp_path / 'beta.md'}:4: [[missing-two]] has no note",
    ]
    assert result.stderr == ""


def test_notes_check_passes_a_clean_folder_and_model_links_with_a_config(tmp_path):
    (tmp_path / "a.md").write_text("[[b]]\n")
    (tmp_path / "b.md").write_text("[[glm-4.7-flash-sglang-tp2]]\n")
    assert swaplab("notes", "check", str(tmp_path)).returncode == 1  # without a config, a model name is no note
    result = swaplab("notes", "check", str(tmp_path), "--config", str(SEED_CONFIG))
    assert (result.returncode, result.stdout) == (0, "")


def test_notes_show_prints_the_notes_of_a_model_through_its_alias():
    result = swaplab("notes", "show", "glm-flash-sglang", "--config", str(SEED_CONFIG), "--notes", str(SEED_NOTES))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "glm-4-7-flash (glm-4.7-flash.md): file name is a prefix of glm-4.7-flash-sglang-tp2"
    assert "Added zai-org/GLM-4.7-Flash (unsloth GGUF, UD-Q4_K_XL) to llama-swap.yaml as model key" in lines
    assert "vram-spend-priority (vram-spend-priority.md)" not in result.stdout
    # Without the config only the name itself matches, and nothing belongs to the bare id.
    alone = swaplab("notes", "show", "glm-flash-sglang", "--notes", str(SEED_NOTES))
    assert (alone.returncode, alone.stdout) == (0, f"No notes in {SEED_NOTES} belong to glm-flash-sglang.\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("notes", "check", "/nonexistent/notes"), "swaplab: notes folder /nonexistent/notes does not exist"),
        (("notes", "show", "m", "--notes", "/nonexistent/notes"), "swaplab: notes folder /nonexistent/notes does not exist"),
        (("notes", "show", "m", "--notes", str(SEED_NOTES), "--config", "/nonexistent.yaml"),
         "/nonexistent.yaml:1: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = swaplab(*args)
    assert (result.returncode, result.stderr, result.stdout) == (2, message + "\n", "")


def test_broken_front_matter_is_located(tmp_path):
    (tmp_path / "bad.md").write_text("---\ntitle: [unclosed\n---\nbody\n")
    result = swaplab("notes", "check", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"swaplab: {tmp_path / 'bad.md'}:")
    assert "front matter is not valid YAML" in result.stderr and result.stderr.count("\n") == 1
    with pytest.raises(NotesError):
        load_notes(tmp_path)
