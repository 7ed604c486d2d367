// Package doccheck checks that the docs name things that exist.
package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// Every test docs/testing.md names (guard, test, control) exists in some _test.go file:
// a renamed or deleted test must take its row with it.
func TestTestingDocNamesExistingTests(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*`).FindAllString(string(doc), -1)
	if len(named) < 20 {
		t.Fatalf("docs/testing.md names %d tests; the table is gone?", len(named))
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range named {
		if !defined[name] {
			t.Errorf("docs/testing.md names %s, which no _test.go file defines", name)
		}
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
