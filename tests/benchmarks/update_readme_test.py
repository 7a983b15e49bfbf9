"""benchmarks/paper/update_readme.py: rewrites only its block, idempotently, and refuses bad READMEs untouched."""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = sys.argv.pop(1) if len(sys.argv) > 1 else "benchmarks/paper/update_readme.py"
spec = importlib.util.spec_from_file_location("update_readme", SCRIPT)
update_readme = importlib.util.module_from_spec(spec)
spec.loader.exec_module(update_readme)

README = """# project

Intro, with a marker-like line that is not one: results:begin.

## Results

<!-- results:begin -->

old generated line

<!-- results:end -->

## After

Hand-written text that must survive.
"""


class ReplaceBlockTest(unittest.TestCase):
    def test_only_the_block_changes(self):
        out = update_readme.replace_block(README, "new line 1\nnew line 2\n")
        self.assertIn("new line 1\nnew line 2", out)
        self.assertNotIn("old generated line", out)
        before = README.split(update_readme.BEGIN)[0]
        after = README.split(update_readme.END)[1]
        self.assertTrue(out.startswith(before + update_readme.BEGIN))
        self.assertTrue(out.endswith(update_readme.END + after))

    def test_idempotent(self):
        once = update_readme.replace_block(README, "\n\nblock\n\n\n")
        twice = update_readme.replace_block(once, "block")
        self.assertEqual(once, twice)
        # The committed shape: one blank line around the block.
        self.assertIn(update_readme.BEGIN + "\n\nblock\n\n" + update_readme.END, once)

    def test_bad_markers_are_refused(self):
        for text in ["no markers", README.replace(update_readme.END, ""),
                     README + update_readme.BEGIN,
                     update_readme.END + "\n" + update_readme.BEGIN]:
            with self.assertRaises(update_readme.BlockError):
                update_readme.replace_block(text, "x")


class CommandTest(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)

    def test_rewrites_copies_and_is_idempotent(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "paper-run")
            os.makedirs(out)
            for name, body in [("readme_results.md", "- generated summary\n"), ("claims.md", "# table\n"),
                               ("claims.csv", "claim\n"), ("claims.json", "{}"),
                               ("trace_prefetch_none.json", "{}")]:
                with open(os.path.join(out, name), "w") as f:
                    f.write(body)
            readme = os.path.join(d, "README.md")
            with open(readme, "w") as f:
                f.write(README)
            results = os.path.join(d, "results")
            r = self.run_script(out, "--readme", readme, "--results", results)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(readme) as f:
                first = f.read()
            self.assertIn("- generated summary", first)
            self.assertIn("Hand-written text that must survive.", first)
            self.assertEqual(sorted(os.listdir(results)), ["claims.csv", "claims.md"])
            r = self.run_script(out, "--readme", readme, "--results", results)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("already up to date", r.stdout)
            with open(readme) as f:
                self.assertEqual(f.read(), first)

    def test_bad_input_leaves_the_readme_alone(self):
        with tempfile.TemporaryDirectory() as d:
            readme = os.path.join(d, "README.md")
            with open(readme, "w") as f:
                f.write("no markers here\n")
            out = os.path.join(d, "run")
            os.makedirs(out)
            r = self.run_script(out, "--readme", readme, "--no_copy")
            self.assertEqual(r.returncode, 2)
            self.assertIn("readme_results.md not found", r.stderr)
            with open(os.path.join(out, "readme_results.md"), "w") as f:
                f.write("x\n")
            r = self.run_script(out, "--readme", readme, "--no_copy")
            self.assertEqual(r.returncode, 2)
            self.assertIn("appears 0 times", r.stderr)
            with open(readme) as f:
                self.assertEqual(f.read(), "no markers here\n")


if __name__ == "__main__":
    unittest.main()
