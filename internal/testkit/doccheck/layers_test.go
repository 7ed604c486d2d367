package doccheck

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The layers docs/architecture.md draws, lowest first: a package imports (in its
// non-test files) only packages of its own layer or below, and no test support. A
// package of this module that no layer names fails the test: a new package must be
// placed in a layer.
var layers = [][]string{
	{"client", "internal/base/"},
	{"checkpoint", "logstream", "epoch", "workflow", "steps", "dlq", "steplog"},
	{"engine"},
	{"flowd", "internal/app/", "cmd/", "examples/"},
}

const module = "github.com/flowrun/flow"

// layerOf is the layer of a package of this module (-1: test support, -2: unplaced).
func layerOf(pkg string) int {
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
	if strings.HasPrefix(rel, "internal/testkit/") {
		return -1
	}
	for i, l := range layers {
		for _, p := range l {
			if rel == strings.TrimSuffix(p, "/") || strings.HasPrefix(rel, strings.TrimSuffix(p, "/")+"/") {
				return i
			}
		}
	}
	return -2
}

func TestLayers(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, imports := f[0], f[1:]
		from := layerOf(pkg)
		switch from {
		case -1:
			continue
		case -2:
			t.Errorf("%s is in no layer of docs/architecture.md: place it (doccheck's layers)", pkg)
			continue
		}
		checked++
		for _, imp := range imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			switch to := layerOf(imp); {
			case to == -1:
				t.Errorf("%s imports test support %s", pkg, imp)
			case to > from:
				t.Errorf("%s (layer %d) imports %s (layer %d): a layer imports only the layers below it", pkg, from, imp, to)
			}
		}
	}
	if checked < 30 {
		t.Fatalf("only %d packages checked: go list said %q", checked, out)
	}
}

// flowctl links no server: no Pebble, no nats-server, none of the node's packages.
func TestFlowctlLinksNoServer(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/flowctl")
	cmd.Dir = filepath.Join("..", "..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps ./cmd/flowctl: %q", out)
	}
	for _, d := range deps {
		for _, banned := range []string{"cockroachdb/pebble", "nats-server", module + "/engine", module + "/checkpoint", module + "/epoch", module + "/logstream"} {
			if strings.Contains(d, banned) {
				t.Errorf("flowctl links %s", d)
			}
		}
	}
}
