package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// workflow validate, offline, refuses a with the built-in kind would refuse at run
// time, at its file:line:column, with exit code 2.
func TestValidateChecksWith(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sleepy.yaml")
	if err := os.WriteFile(file, []byte("name: sleepy\nsteps:\n  - name: a\n    uses: sleep\n    with:\n      duration: soon\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := Run([]string{"workflow", "validate", "-f", file}, &out, &errOut, func(string) string { return "" })
	if code != 2 || !strings.Contains(errOut.String(), file+`:6:17: step "a" (sleep): with.duration: "soon" is not a duration`) {
		t.Fatalf("validate: %d %q %q", code, out.String(), errOut.String())
	}
}
