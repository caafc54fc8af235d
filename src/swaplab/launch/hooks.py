"""`[[pre_serve]]` hooks: the small `sh -c` program that runs them in a rank's place before its server.

Both kinds of engine use the same program. `up` first stages each copied file on every node
(a prepare step, the file's bytes through ssh's stdin); the rank's command then becomes
`sh -c WRAPPER pre_serve N SOURCE TARGET... SERVER...`: it copies each staged file to its
target, runs each hook with its output prefixed `[pre_serve N] `, and `exec`s the server
command. A hook that fails ends the rank with the hook's exit code and a line naming the hook
and its recipe line, so the gang stops with that output. The staged paths and the server
command arrive as positional parameters; the hooks' own words are the recipe's, quoted.
`down` removes the staged files once the ranks are stopped (`unstaging_argv`).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from swaplab.launch.spec import PreServeHook, Recipe, Step
from swaplab.launch.state import NODE_ROOT

CONTAINER_STAGING = "/swaplab/pre-serve"
"""Where a container sees the staged files (read-only bind mounts)."""

_STAGE = 'mkdir -p "${1%/*}" && cat > "$1"'
"""$1: the staged file's path on the node; stdin: its bytes."""

_UNSTAGE = 'path=$1; case $path in "~/"*) path=$HOME/${path#"~/"};; esac; rm -rf -- "$path"'
"""$1: the recipe's staging folder on the node (a leading ~/ is the node's home); gone or never there."""

# `hook` keeps the hook's exit code past the pipe that prefixes its lines (POSIX sh has no
# pipefail): the code leaves through fd 3, the prefixed lines through fd 4.
_PRELUDE = r"""count=$1; shift
while [ "$count" -gt 0 ]; do
    mkdir -p "$(dirname -- "$2")" && cp -- "$1" "$2" || { echo "[pre_serve] copying $1 to $2 failed; the server was not started"; exit 1; }
    shift 2; count=$((count - 1))
done
hook() {
    number=$1; where=$2; shift 2
    exec 4>&1
    code=$( { { "$@" 2>&1 < /dev/null; echo $? >&3; } | sed "s/^/[pre_serve $number] /" >&4; } 3>&1 )
    if [ "$code" != 0 ]; then
        echo "[pre_serve $number] pre_serve hook $number ($where) exited with code $code; the server was not started"
        exit "$code"
    fi
}
"""


def staging_folder(recipe: Recipe) -> str:
    """Where every run of the recipe stages its copies on a node, beside the recipe's rank folders."""
    return f"~/{NODE_ROOT}/{recipe.slug}/pre-serve"


def staged_path(recipe: Recipe, run_id: str, index: int) -> str:
    """Where copy number `index` (0, 1, ... over all hooks) is staged on each node."""
    return f"{staging_folder(recipe)}/{run_id}/{index}"


def unstaging_argv(recipe: Recipe) -> tuple[str, ...]:
    """The node command that removes what every run of the recipe staged there; succeeds when nothing is.

    Every run, not one: the run id follows the recipe's values, so a recipe edited since its
    `up` would name another run, and `down` stops every gang of the recipe anyway.
    """
    return ("sh", "-c", _UNSTAGE, "swaplab", staging_folder(recipe))


def copies_of(recipe: Recipe) -> list[tuple[int, PreServeHook, int]]:
    """Every copy as (index over all hooks, its hook, its index in the hook)."""
    found = []
    for hook in recipe.pre_serve:
        for position in range(len(hook.copies)):
            found.append((len(found), hook, position))
    return found


def staging_steps(recipe: Recipe, run_id: str) -> list[Step]:
    """The prepare steps that put each copied file on a node, ready to be copied into place."""
    steps = []
    for index, hook, position in copies_of(recipe):
        copy = hook.copies[position]
        steps.append(Step(
            f"stage pre_serve {hook.number} {copy.source.name}", ("sh", "-c", _STAGE, "swaplab", staged_path(recipe, run_id, index)),
            "prepare", stdin_from=("cat", "--", str(copy.source)),
        ))
    return steps


def wrapped(
    recipe: Recipe, server: Sequence[str], *, source: Callable[[int], str], word: Callable[[str], str] = str,
) -> tuple[str, ...]:
    """`server` run after the recipe's hooks (itself when there are none).

    `source(index)`: where the rank sees staged copy `index`; `word`: what each hook word and
    target become (the process engine's placeholders).
    """
    if not recipe.pre_serve:
        return tuple(server)
    lines = [_PRELUDE]
    for hook in recipe.pre_serve:
        if hook.run:
            where = f"{recipe.path.name} line {hook.line}"
            lines.append(shlex.join(["hook", str(hook.number), where, *(word(part) for part in hook.run)]) + "\n")
    lines.append('exec "$@"\n')
    pairs: list[str] = []
    for index, hook, position in copies_of(recipe):
        pairs += [source(index), word(hook.copies[position].target)]
    return ("sh", "-c", "".join(lines), "pre_serve", str(len(pairs) // 2), *pairs, *server)
