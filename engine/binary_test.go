package engine

import (
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

// The roster's binary names a build well enough to tell two apart: a commit (dirty or
// not) rather than `flowd (devel)` for every build from a checkout (issue 38).
func TestBinaryName(t *testing.T) {
	build := func(mod string, settings ...string) *debug.BuildInfo {
		info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/flowrun/flow", Version: mod}}
		for i := 0; i+1 < len(settings); i += 2 {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return info
	}
	const rev = "57faf829c3b1a0e2d4f6a8b0c2e4f6a8b0c2e4f6"
	noID := func() string { return "" }
	someID := func() string {
		return "pw4eieajb6QAdQcUOyOe/KX5FT7dPrR_1fOfo0bKd/45fSHxMTg6wImVIXNGyN/Pvkbn3eQ-njUFLUbr0xM"
	}
	for _, c := range []struct {
		name, linked string
		info         *debug.BuildInfo
		id           func() string
		want         string
	}{
		{"linked", "v1.4.0-3-g57faf82", build("(devel)", "vcs.revision", rev), noID, "flowd v1.4.0-3-g57faf82"},
		{"checkout", "", build("(devel)", "vcs.revision", rev, "vcs.modified", "false"), noID, "flowd devel+57faf82"},
		{"checkout, changed files", "", build("(devel)", "vcs.revision", rev, "vcs.modified", "true"), noID, "flowd devel+57faf82-dirty"},
		{"checkout, Go 1.24's pseudo-version", "", build("v0.0.0-20261205075400-57faf829c3b1+dirty", "vcs.revision", rev, "vcs.modified", "true"), noID, "flowd devel+57faf82-dirty"},
		{"a tag", "", build("v1.4.0", "vcs.revision", rev, "vcs.modified", "false"), noID, "flowd v1.4.0"},
		{"a tag, changed files", "", build("v1.4.0+dirty", "vcs.revision", rev, "vcs.modified", "true"), noID, "flowd v1.4.0+dirty"},
		{"go install module@version", "", build("v1.4.0"), noID, "flowd v1.4.0"},
		{"no commit recorded", "", build("(devel)"), someID, "flowd devel+build.Pvkbn3eQ-n"},
		{"nothing recorded", "", build("(devel)"), noID, "flowd (devel)"},
		{"no build info", "", nil, noID, "flowd (unknown build)"},
	} {
		if got := binaryName(c.linked, c.info, c.id); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// Two commits, or a commit with and without changes, are two names.
	a := binaryName("", build("(devel)", "vcs.revision", rev), noID)
	b := binaryName("", build("(devel)", "vcs.revision", "0123456789abcdef"), noID)
	if a == b {
		t.Fatalf("two commits, one name: %q", a)
	}
}

// The build ID read from this very executable is the one the go command sees.
func TestExecutableBuildID(t *testing.T) {
	id := executableBuildID()
	if id == "" {
		t.Fatal("no build ID read from the test binary")
	}
	exe, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "tool", "buildid", self).Output()
	if err != nil {
		t.Skipf("go tool buildid: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != id {
		t.Fatalf("read %q; go tool buildid says %q", id, got)
	}
}

// This test binary records no commit (go test stamps none): it is named by its build ID,
// not `flowd (devel)` as every such build was.
func TestBinaryNamesThisBuild(t *testing.T) {
	if b := Binary(); !strings.HasPrefix(b, "flowd devel+") {
		t.Fatalf("Binary() = %q: names no build", b)
	}
}
