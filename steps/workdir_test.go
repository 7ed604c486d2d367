package steps

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// stdoutOf runs x with `with` and returns the command's stdout.
func stdoutOf(t *testing.T, x Exec, with map[string]any) string {
	t.Helper()
	out, err := x.Run(context.Background(), in(with))
	if err != nil {
		t.Fatal(err)
	}
	var o struct{ Stdout string }
	if err := json.Unmarshal(out, &o); err != nil {
		t.Fatalf("output %s: %v", out, err)
	}
	return o.Stdout
}

// Each exec step runs in a fresh, empty working directory of its own (not flowd's,
// where the data dir and the users file may be), removed after the step with what the
// step left in it, even a directory it made unwritable. A step that names `dir` runs
// there, and that directory is left alone. A relative program path still means flowd's
// working directory, as before steps had one of their own.
func TestExecRunsInAFreshWorkingDirectory(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(string(m), func(t *testing.T) {
			x := Exec{MaxOutput: 1 << 20, mode: m}
			script := `pwd; ls -A | wc -l; mkdir sub; touch sub/f left; chmod 500 sub`
			var dirs []string
			for range 2 {
				lines := strings.Fields(stdoutOf(t, x, map[string]any{"command": list("sh", "-c", script)}))
				if len(lines) != 2 || lines[1] != "0" {
					t.Fatalf("pwd and entries: %q; want a directory and 0 entries", lines)
				}
				dirs = append(dirs, lines[0])
				if !strings.HasPrefix(lines[0], filepath.Join(os.TempDir(), "flow-step-"+strconv.Itoa(os.Getpid())+"-")) {
					t.Fatalf("working directory %s; want a fresh one under %s", lines[0], os.TempDir())
				}
				if _, err := os.Stat(lines[0]); !os.IsNotExist(err) {
					t.Fatalf("the step's working directory %s is still there after it: %v", lines[0], err)
				}
			}
			if dirs[0] == dirs[1] {
				t.Fatalf("two steps got the same working directory %s", dirs[0])
			}

			named := t.TempDir()
			if got := strings.Fields(stdoutOf(t, x, map[string]any{"command": list("sh", "-c", script), "dir": named})); len(got) != 2 || got[0] != named {
				t.Fatalf("with dir %s: %q", named, got)
			}
			if _, err := os.Stat(filepath.Join(named, "left")); err != nil {
				t.Fatalf("the named directory was not left alone: %v", err)
			}

			t.Chdir(t.TempDir()) // this process's working directory: where ./prog.sh is
			if err := os.WriteFile("prog.sh", []byte("#!/bin/sh\necho from-prog\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			if got := stdoutOf(t, x, map[string]any{"command": list("./prog.sh")}); got != "from-prog" {
				t.Fatalf("./prog.sh: %q", got)
			}
		})
	}
}

// A process that dies with steps running (a SIGKILLed flowd) cannot remove their
// working directories; the next flowd removes them at start: those named by a process
// that no longer runs, and only those. The control: a directory of a live process
// (this one) stays.
func TestRemoveStaleWorkDirs(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale, err := os.MkdirTemp("", "flow-step-"+strconv.Itoa(dead.Process.Pid)+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stale) })
	if err := os.WriteFile(filepath.Join(stale, "left"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := workDir(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(live) })
	n, err := RemoveStaleWorkDirs(nil)
	if err != nil || n < 1 {
		t.Fatalf("removed %d: %v", n, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the dead process's directory is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("a live process's directory was removed: %v", err)
	}
}
