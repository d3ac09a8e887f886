#!/usr/bin/env python3
"""check_readme.py — run the commands a README shows, so that they stay true.

    python3 scripts/check_readme.py [README.md] [--no-build] [--timeout SECONDS]

Every ```sh (or ```bash, ```shell) block is split into commands (one a line,
a trailing backslash joining lines; comment lines ignored), and each command
runs with bash from the repository root, in order. The first failure stops
the check with the README line of the command, its exit status and the end of
its output: exit 1. Every ```python block runs as a script with the
repository's virtual environment (.venv/bin/python, PYTHONPATH=python) when
that interpreter exists and imports torch; otherwise each block is reported
as skipped. Python blocks run in a scratch directory whose entries link to the
repository's top level, so that relative paths such as examples/mlp.ir work
and the files a snippet writes (resnet18.ir, ...) land outside the tree.
Exit 0 when everything ran and passed.

What cannot run inside the test suite is excluded in the README itself, by a
marker on its own line right before the block (an HTML comment, which
renders as nothing):

    <!-- check_readme: skip ./scripts/setup.sh (it installs packages) -->

A marker names the start of a command and why. Every command of the block
that starts with it is skipped, and so is every part of a `&&` chain that
does (`./scripts/setup.sh && cmake ...` runs the chain without setup.sh).
Skips are printed; a marker that matches nothing in its block is an error,
and so is running scripts/setup.sh or scripts/test.sh without one (the first
installs packages, the second runs this check).

--no-build also skips every `cmake` command (printed as skipped): for a run
on a machine where the build directory must not be touched. Only the
standard library is used.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SH_LANGS = {"sh", "bash", "shell"}
MARKER = re.compile(r"^\s*<!--\s*check_readme:\s*skip\s+(\S+)\s*(?:\((.*)\))?\s*-->\s*$")
NEEDS_MARKER = ("scripts/setup.sh", "scripts/test.sh")   # must never run unmarked


class Block:
    def __init__(self, lang, line, body, skips):
        self.lang, self.line, self.body, self.skips = lang, line, body, skips


def read_blocks(path):
    """The fenced blocks of a Markdown file: language, line of the first body
    line (1-based), body lines, and the skip markers right before it."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, pending, i = [], [], 0
    while i < len(lines):
        text = lines[i]
        m = MARKER.match(text)
        if not m and re.match(r"^\s*<!--\s*check_readme\b", text):   # a marker this reads otherwise would skip nothing
            sys.exit(f"{path}:{i + 1}: a check_readme marker it cannot read (the form is "
                     f"'<!-- check_readme: skip COMMAND_START (why) -->', COMMAND_START one word): {text.strip()}")
        if m:
            pending.append((m.group(1), m.group(2) or "no reason given", i + 1))
            i += 1
            continue
        fence = re.match(r"^(\s*)(```+|~~~+)\s*([A-Za-z0-9_+-]*)", text)
        if fence:
            indent, mark, lang = fence.group(1), fence.group(2), fence.group(3).lower()
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(mark[:3]):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            blocks.append(Block(lang, i + 2, body, pending))
            pending, i = [], j + 1
            continue
        if text.strip():
            if pending:
                where = ", ".join(f"line {ln}" for _, _, ln in pending)
                raise SystemExit(f"{path}: check_readme marker at {where} is not right before a code block")
            pending = []
        i += 1
    if pending:
        raise SystemExit(f"{path}: check_readme marker at line {pending[0][2]} is not followed by a code block")
    return blocks


def commands(block):
    """(line, command) for each command of a shell block."""
    out, cur, start = [], "", None
    for k, text in enumerate(block.body):
        if not cur and (not text.strip() or text.lstrip().startswith("#")):
            continue
        if start is None:
            start = block.line + k
        if text.rstrip().endswith("\\"):
            cur += text.rstrip()[:-1] + " "
            continue
        cur += text
        out.append((start, cur.strip()))
        cur, start = "", None
    if cur:
        out.append((start, cur.strip()))
    return out


def split_and(cmd):
    """Split a command at its top-level `&&` (outside quotes and comments)."""
    parts, cur, quote, k = [], "", None, 0
    while k < len(cmd):
        c = cmd[k]
        if quote:
            cur += c
            if c == "\\" and quote == '"' and k + 1 < len(cmd):
                cur += cmd[k + 1]
                k += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote, cur = c, cur + c
        elif c == "\\" and k + 1 < len(cmd):
            cur += c + cmd[k + 1]
            k += 1
        elif c == "#" and (not cur or cur[-1] in " \t;|&("):   # a comment: the rest of the line
            cur += cmd[k:]
            break
        elif cmd.startswith("&&", k):
            parts.append(cur.strip())
            cur = ""
            k += 1
        else:
            cur += c
        k += 1
    parts.append(cur.strip())
    return parts


def starts_with(part, prefix):
    return part == prefix or part.startswith(prefix + " ") or part.startswith(prefix + "\t")


def normalized(word):
    return word[2:] if word.startswith("./") else word


def tail(text, n=40):
    if not text.strip():
        return "    (no output)"
    lines = text.rstrip("\n").split("\n")
    return "\n".join(("    " + l) for l in lines[-n:])


def run(argv, cwd, env, timeout):
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        rc, out = p.returncode, p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        rc, out = None, (e.stdout or b"").decode("utf-8", "replace") + f"\n(timed out after {timeout} s)"
    return rc, out, time.monotonic() - t0


def venv_python():
    """The venv's interpreter when it imports torch, else (None, why)."""
    py = os.path.join(REPO, ".venv", "bin", "python")
    if not os.path.exists(py):
        return None, ".venv/bin/python does not exist (scripts/setup.sh makes it)"
    try:
        ok = subprocess.run([py, "-c", "import torch"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=300).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    return (py, None) if ok else (None, ".venv/bin/python cannot import torch")


def scratch_dir():
    """A temporary directory whose entries link to the repository's top level."""
    d = tempfile.mkdtemp(prefix="check_readme.")
    for name in os.listdir(REPO):
        if name != ".git":
            os.symlink(os.path.join(REPO, name), os.path.join(d, name))
    return d


def main():
    ap = argparse.ArgumentParser(description="Run the commands and Python snippets of a README.")
    ap.add_argument("readme", nargs="?", default=os.path.join(REPO, "README.md"))
    ap.add_argument("--no-build", action="store_true", help="skip every cmake command (printed as skipped)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one command or snippet may take (900)")
    a = ap.parse_args()
    name = os.path.relpath(a.readme)
    if name.startswith(".."):
        name = a.readme
    t_all = time.monotonic()
    blocks = read_blocks(a.readme)
    ran = skipped = 0
    env = dict(os.environ)
    if os.geteuid() == 0:   # CI and containers run as root, which Open MPI's mpirun refuses unless told
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    py, no_py = None, None
    scratch = None
    try:
        for b in blocks:
            if b.lang in SH_LANGS:
                plan, used = [], set()   # (line, parts to run, parts skipped with why), before anything runs
                for line, cmd in commands(b):
                    keep, skip = [], []
                    for part in split_and(cmd):
                        first = part.split()[0] if part.split() else ""
                        hit = [s for s in b.skips if starts_with(normalized(part), normalized(s[0]))]
                        if hit:
                            used.add(hit[0][0])
                            skip.append((part, hit[0][1]))
                        elif any(s in part for s in NEEDS_MARKER):
                            print(f"{name}:{line}: error: `{part}` must not run here (scripts/setup.sh installs "
                                  f"packages, scripts/test.sh runs this check): put "
                                  f"<!-- check_readme: skip {first} (why) --> before the block")
                            return 1
                        elif a.no_build and first == "cmake":
                            skip.append((part, "--no-build"))
                        else:
                            keep.append(part)
                    plan.append((line, keep, skip))
                stale = [s for s in b.skips if s[0] not in used]
                if stale:
                    print(f"{name}:{stale[0][2]}: error: the marker names `{stale[0][0]}`, which no command of the "
                          f"block (line {b.line}) starts with")
                    return 1
                for line, keep, skip in plan:
                    for part, why in skip:
                        print(f"{name}:{line}: skipped ({why}): {part}")
                        skipped += 1
                    if not keep:
                        continue
                    todo = " && ".join(keep)
                    rc, out, dt = run(["bash", "-o", "pipefail", "-c", todo], REPO, env, a.timeout)
                    if rc != 0:
                        print(f"{name}:{line}: command failed ({'timed out' if rc is None else f'exit {rc}'}): {todo}")
                        print(tail(out))
                        return 1
                    # a value the command's comment promises (`# ... loss : f32[] = 3.352683`) must be printed
                    comment = todo.split(" # ", 1)[1] if " # " in todo else ""
                    missing = [c for c in re.findall(r"\w+ : \w+\[[^\]]*\] = [-+\w.]+", comment) if c not in out]
                    if missing:
                        print(f"{name}:{line}: the command ran but did not print `{missing[0]}`, which the README "
                              f"says it does: {todo}")
                        print(tail(out))
                        return 1
                    print(f"{name}:{line}: ok ({dt:.1f} s): {todo}")
                    ran += 1
            elif b.lang == "python":
                if b.skips:
                    print(f"{name}:{b.skips[0][2]}: error: skip markers are for shell blocks only")
                    return 1
                if py is None and no_py is None:
                    py, no_py = venv_python()
                if py is None:
                    print(f"{name}:{b.line}: skipped python block ({no_py})")
                    skipped += 1
                    continue
                if scratch is None:
                    scratch = scratch_dir()
                script = os.path.join(scratch, f"readme_{b.line}.py")
                with open(script, "w", encoding="utf-8") as f:
                    f.write("\n".join(b.body) + "\n")
                penv = dict(env)
                penv["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python")] +
                                                     ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
                rc, out, dt = run([py, script], scratch, penv, a.timeout)
                if rc != 0:
                    print(f"{name}:{b.line}: python block failed ({'timed out' if rc is None else f'exit {rc}'})")
                    print(tail(out))
                    return 1
                print(f"{name}:{b.line}: ok ({dt:.1f} s): python block of {len(b.body)} lines")
                ran += 1
            elif b.skips:
                print(f"{name}:{b.skips[0][2]}: error: skip markers are for shell blocks only")
                return 1
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"{name}: {ran} passed, {skipped} skipped, in {time.monotonic() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
