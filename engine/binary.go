package engine

import (
	"bytes"
	"debug/elf"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
)

// version, set at link time (-X github.com/flowrun/flow/engine.version=...; the image's
// build sets `git describe`), names this build in Binary.
var version string

// Binary names this flowd build in the cluster's roster and node reports (`flowctl
// cluster status`), so that two builds can be told apart (docs/operations.md,
// "Upgrading"): the version it was linked with; else its module's version when it is a
// release; else the commit it was built from, `flowd devel+57faf82` (`-dirty` when built
// from changed files); else, when the build recorded no commit (`go run`, `go test`,
// -buildvcs=false, a tree without .git), the start of its Go build ID's content part,
// `flowd devel+build.Pvkbn3eQ-n` (`go tool buildid FILE` prints the whole). It was
// `flowd (devel)` for every such build (issue 38).
func Binary() string { return binary() }

var binary = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return binaryName(version, info, executableBuildID)
})

// pseudoVersion matches the version the go command gives a main module built from a
// commit that no tag names (Go 1.24 and later): v0.0.0-20261205075400-57faf82abcde, with
// +dirty for changed files. The commit says the same, shorter.
var pseudoVersion = regexp.MustCompile(`-(0\.)?\d{14}-[0-9a-f]{12}(\+dirty)?$`)

// binaryName is Binary's choice, given what the build recorded: linked (the -X
// version), info (nil when the binary has none) and buildID (the executable's Go build
// ID, read only when nothing else names the build; "" when unknown).
func binaryName(linked string, info *debug.BuildInfo, buildID func() string) string {
	if linked != "" {
		return "flowd " + linked
	}
	var mod, rev, dirty string
	if info != nil {
		mod = info.Main.Version
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value[:min(len(s.Value), 7)]
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "-dirty"
				}
			}
		}
	}
	switch {
	case mod != "" && mod != "(devel)" && (rev == "" || !pseudoVersion.MatchString(mod)):
		return "flowd " + mod
	case rev != "":
		return "flowd devel+" + rev + dirty
	}
	if id := buildID(); id != "" {
		content := id[strings.LastIndexByte(id, '/')+1:]
		return "flowd devel+build." + content[:min(len(content), 10)]
	}
	if info == nil {
		return "flowd (unknown build)"
	}
	return "flowd (devel)"
}

// executableBuildID is this executable's Go build ID ("" if it cannot be read): from
// its ELF note, or else the string the linker puts near the start of the text (Mach-O,
// PE), as cmd/go's buildid reads it. It reads a note or the first MiB, not the file.
func executableBuildID() string {
	path, err := os.Executable()
	if err != nil {
		return ""
	}
	if f, err := elf.Open(path); err == nil {
		defer f.Close()
		if s := f.Section(".note.go.buildid"); s != nil {
			if data, err := s.Data(); err == nil {
				return goNoteBuildID(data)
			}
		}
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	head, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	const marker = "\xff Go build ID: \""
	i := bytes.Index(head, []byte(marker))
	if i < 0 {
		return ""
	}
	rest := head[i+len(marker):]
	if j := bytes.IndexByte(rest, '"'); j > 0 {
		return string(rest[:j])
	}
	return ""
}

// goNoteBuildID reads the Go build ID out of its ELF note: name size, description size
// and type (4 bytes each, little-endian on every platform flowd builds for), the name
// "Go\x00\x00", then the ID.
func goNoteBuildID(note []byte) string {
	if len(note) < 16 {
		return ""
	}
	le := func(b []byte) int { return int(b[0]) | int(b[1])<<8 | int(b[2])<<16 | int(b[3])<<24 }
	namesz, descsz := le(note[0:]), le(note[4:])
	start := 12 + (namesz+3)&^3
	if namesz != 4 || string(note[12:15]) != "Go\x00" || start+descsz > len(note) {
		return ""
	}
	return string(note[start : start+descsz])
}
