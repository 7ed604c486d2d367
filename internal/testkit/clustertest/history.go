package clustertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A previous release of flowd, built from this checkout's history: the rolling upgrade
// runs the code users ran, not today's code linked to behave as it did.

var historyMu sync.Mutex

// FlowdAt builds cmd/flowd as it was at commit (git archive of this checkout's history,
// then go build without the race detector: it is the old program, not the code under
// test) and returns the binary's path; ok is false when the history does not hold the
// commit (a shallow clone). The binary is kept in the user's cache directory by
// commit, so a machine builds each release once.
func FlowdAt(t testing.TB, commit string) (bin string, ok bool) {
	t.Helper()
	historyMu.Lock()
	defer historyMu.Unlock()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "flow-clustertest")
	bin = filepath.Join(dir, "flowd-"+commit)
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, true
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Logf("no git checkout here (%v): the previous release cannot be built", err)
		return "", false
	}
	top := strings.TrimSpace(string(root))
	if err := exec.Command("git", "-C", top, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Logf("this checkout's history does not hold %s (a shallow clone?): the previous release cannot be built", commit)
		return "", false
	}
	src, err := os.MkdirTemp("", "flow-release-src")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(src)
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", top, commit, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.CreateTemp(dir, "flowd-building-")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	build := exec.Command("go", "build", "-o", tmp.Name(), "./cmd/flowd")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.Remove(tmp.Name())
		t.Fatalf("build flowd at %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil { // whole, or not at all
		t.Fatal(err)
	}
	return bin, true
}
