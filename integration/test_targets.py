"""The workspace's integration-test targets, one name a line, from `cargo metadata`.

integration/test.sh runs a few test binaries beside the others and names the rest with this,
so that a test target added later is run without anyone listing it.

    python integration/test_targets.py [--exclude-package NAME ...] [--except TARGET ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exclude-package", nargs="*", default=[], help="packages whose targets are left out")
    ap.add_argument("--except", dest="skip", nargs="*", default=[], help="target names left out")
    args = ap.parse_args()
    meta = json.loads(
        subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1", "--locked"])
    )
    members = set(meta["workspace_members"])
    names = {
        t["name"]
        for p in meta["packages"]
        if p["id"] in members and p["name"] not in args.exclude_package
        for t in p["targets"]
        if "test" in t["kind"]
    }
    unknown = set(args.skip) - names
    if unknown:
        # A renamed target would otherwise run nowhere.
        print(f"test_targets: no test target named {sorted(unknown)}", file=sys.stderr)
        return 1
    for name in sorted(names - set(args.skip)):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
