"""What the zoo's comparisons with transformers share: running a script of tests/zoo/ in the forky
chroot (ci/forky.sh), and judging the planted bugs - each must make the comparison fail on exactly the
cases it touches, or the comparison proves nothing."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests


def transformers_answer(script, *args):
    """The JSON the script prints as its last line, run by the chroot's python3; or a string saying
    why it could not run (no chroot, or transformers failed there)."""
    if not os.path.isfile(os.path.join(ROOT, ".engines", "forky-root", "versions.txt")):
        return "no forky chroot (.engines/forky-root; ci/forky.sh makes it): transformers is not here"
    run = subprocess.run([os.path.join(ROOT, "engines", "forky", "run.sh"), "/usr/bin/python3", "/suite/tests/zoo/" + script]
                         + list(args), capture_output=True, text=True)
    if run.returncode != 0:
        return "transformers could not run in the forky chroot: " + (run.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(run.stdout.strip().splitlines()[-1])


def ours_logits(dump, jobs):
    """Our loader and model on each job (directory or checkpoint, ids, plant or None) through one
    `zoo_hf_dump --jobs` process (LibTorch starts once): a list of (logits, "") or (None, why)."""
    text = "".join("%s\t%s%s\n" % (d, ",".join(str(i) for i in ids), "\t" + plant if plant else "") for d, ids, plant in jobs)
    run = subprocess.run([dump, "--jobs"], input=text, capture_output=True, text=True)
    lines = run.stdout.splitlines()
    if run.returncode != 0 or len(lines) != len(jobs):
        why = "zoo_hf_dump --jobs exited %d after %d of %d answers: %s" % (run.returncode, len(lines), len(jobs), run.stderr.strip()[-300:])
        return [(None, why)] * len(jobs)
    out = []
    for line in lines:
        doc = json.loads(line)
        out.append((doc["logits"], "") if "logits" in doc else (None, doc.get("error", "?")))
    return out


def plants_caught(plants, differing):
    """plants: name -> the cases it must change; differing(name) -> the cases that differ with it
    planted. Prints a line per plant; True when every plant was caught on exactly its cases."""
    ok = True
    for plant, must in plants.items():
        caught = sorted(differing(plant))
        this = bool(must) and caught == sorted(must)
        print("  planted %s: %s" % (plant, ("caught on " + ", ".join(caught)) if this else
                                    "NOT caught as it must be (differs on %s, must on %s)" % (caught, must)))
        ok &= this
    return ok
