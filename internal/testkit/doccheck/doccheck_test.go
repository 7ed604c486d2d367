// Package doccheck checks that the docs name things that exist.
package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/testhooks"
)

// Every test docs/testing.md names (guard, test, control) exists in some _test.go file:
// a renamed or deleted test must take its row with it.
func TestTestingDocNamesExistingTests(t *testing.T) {
	doc := testingDoc(t)
	named := regexp.MustCompile(`\b(?:Test|Fuzz)[A-Z][A-Za-z0-9_]*`).FindAllString(doc, -1)
	if len(named) < 20 {
		t.Fatalf("docs/testing.md names %d tests; the table is gone?", len(named))
	}
	tests := testIndex(t)
	for _, name := range named {
		if len(tests[name]) == 0 {
			t.Errorf("docs/testing.md names %s, which no _test.go file defines", name)
		}
	}
}

// Each test a row of docs/testing.md names is in the package the row names for it: the
// word before it ("engine `TestFencedStop`"); for a test named without one, the package
// it was named with earlier in the row ("the same test"), or else the last package named
// before it in the cell, or in the row. A package is named by its directory's name or
// its package clause (clustertest, daemon, payout).
func TestTestingDocNamesTheirPackages(t *testing.T) {
	tests := testIndex(t)
	names := packageNames(t)
	ref := regexp.MustCompile("(?:\\b([a-z][a-z0-9]*)\\s+)?`(Test[A-Za-z0-9_]+)`")
	checked := 0
	for _, row := range tableRows(testingDoc(t)) {
		rowPkg, namedWith := "", map[string]string{}
		for _, cell := range row.cells {
			pkg := ""
			for _, m := range ref.FindAllStringSubmatch(cell, -1) {
				switch earlier, ok := namedWith[m[2]]; {
				case m[1] != "" && len(names[m[1]]) > 0:
					pkg = m[1]
				case ok:
					pkg = earlier
				case pkg == "":
					pkg = rowPkg
				}
				if _, ok := namedWith[m[2]]; !ok && pkg != "" {
					namedWith[m[2]] = pkg
				}
				if pkg == "" {
					t.Errorf("docs/testing.md line %d names %s without its package (write the package before it, as in \"engine `TestFencedStop`\")", row.line, m[2])
					continue
				}
				checked++
				if !slices.ContainsFunc(tests[m[2]], func(dir string) bool { return names[pkg][dir] }) {
					t.Errorf("docs/testing.md line %d names %s `%s`; it is defined in %v", row.line, pkg, m[2], tests[m[2]])
				}
			}
			if pkg != "" {
				rowPkg = pkg
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d tests of docs/testing.md checked for their package: the table's form changed?", checked)
	}
}

// Each switch a row of docs/testing.md cites exists: `Hooks.X` is a field of
// testhooks.Hooks; `pkg.name` or `pkg.name=value` (a link-time switch, pkg a package's
// name or path) is a package-level variable of that package; `hooks.x` a field of a
// struct type named hooks, `Type.x` a field of a struct type Type; and a bare
// camel-case name (`keepEndedRunning`, `NoKillSwitch`) something this module declares
// (a field, variable, constant, type or function).
func TestTestingDocNamesExistingSwitches(t *testing.T) {
	decl := declarations(t)
	hooks := map[string]bool{}
	for f := range reflect.TypeFor[testhooks.Hooks]().Fields() {
		hooks[f.Name] = true
	}
	names := packageNames(t)
	code := regexp.MustCompile("`([^`]+)`")
	hooksField := regexp.MustCompile(`^Hooks\.([A-Za-z0-9_]+)$`)
	structField := regexp.MustCompile(`^hooks\.([a-z][A-Za-z0-9_]*)$`)
	typeField := regexp.MustCompile(`^([A-Z][A-Za-z0-9]*)\.([a-z][A-Za-z0-9_]*)$`)
	linkVar := regexp.MustCompile(`^([a-z][a-z0-9/]*)\.([a-z][A-Za-z0-9_]*)(?:=\S*)?$`)
	camel := regexp.MustCompile(`^[A-Za-z][a-z0-9]+[A-Z][A-Za-z0-9]*$`)
	checked := 0
	for _, row := range tableRows(testingDoc(t)) {
		for _, cell := range row.cells {
			for _, m := range code.FindAllStringSubmatch(cell, -1) {
				name := m[1]
				if strings.HasPrefix(name, "Test") || strings.HasPrefix(name, "Fuzz") {
					continue
				}
				switch {
				case hooksField.MatchString(name):
					checked++
					if f := hooksField.FindStringSubmatch(name)[1]; !hooks[f] {
						t.Errorf("docs/testing.md line %d cites %s: testhooks.Hooks has no field %s", row.line, name, f)
					}
				case structField.MatchString(name):
					checked++
					if f := structField.FindStringSubmatch(name)[1]; !decl.fields["hooks"][f] {
						t.Errorf("docs/testing.md line %d cites %s: no struct type named hooks has a field %s", row.line, name, f)
					}
				case typeField.MatchString(name):
					checked++
					if tm := typeField.FindStringSubmatch(name); !decl.fields[tm[1]][tm[2]] {
						t.Errorf("docs/testing.md line %d cites %s: no struct type %s has a field %s", row.line, name, tm[1], tm[2])
					}
				case linkVar.MatchString(name):
					lm := linkVar.FindStringSubmatch(name)
					dirs := names[path.Base(lm[1])]
					if len(dirs) == 0 {
						continue // not one of this module's packages (a file, a subject)
					}
					checked++
					found := false
					for dir := range dirs {
						if (lm[1] == path.Base(lm[1]) || strings.HasSuffix(dir, lm[1])) && decl.vars[dir][lm[2]] {
							found = true
						}
					}
					if !found {
						t.Errorf("docs/testing.md line %d cites %s: package %s has no package-level variable %s", row.line, name, lm[1], lm[2])
					}
				case camel.MatchString(name):
					checked++
					if !decl.any[name] {
						hint := ""
						if up := strings.ToUpper(name[:1]) + name[1:]; hooks[up] {
							hint = fmt.Sprintf(" (now Hooks.%s?)", up)
						}
						t.Errorf("docs/testing.md line %d cites `%s`, which this module does not declare%s", row.line, name, hint)
					}
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("only %d switches of docs/testing.md checked: the table's form changed?", checked)
	}
}

// The README's test command is the last thing .ci/run runs, the same command: what a
// user copies is what CI runs (with its -timeout per package).
func TestCIRunsTheREADMEsTestCommand(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)Run the tests.*?```sh\n([^\n]+)\n```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no test command (a sh block after \"Run the tests\")")
	}
	want := string(m[1])
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, l := range strings.Split(string(ci), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			last = l
		}
	}
	if last != want {
		t.Errorf(".ci/run ends with %q; the README's test command is %q", last, want)
	}
	if !strings.Contains(want, "-timeout ") || !strings.Contains(want, "-race") {
		t.Errorf("the test command %q sets no -timeout per package, or no -race", want)
	}
}

// Every go test that .ci/run starts names its -timeout: a package that hangs fails with
// every goroutine's stack, named, instead of taking go test's default or holding CI.
func TestEveryCITestRunHasATimeout(t *testing.T) {
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	goTest := regexp.MustCompile(`(^|[\s;(])go test `)
	runs := 0
	for i, l := range strings.Split(string(ci), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") || !goTest.MatchString(l) {
			continue
		}
		runs++
		if !strings.Contains(l, "-timeout ") {
			t.Errorf(".ci/run:%d runs go test with no -timeout (add one that the package fits in, with room): %s", i+1, l)
		}
	}
	if runs < 5 {
		t.Fatalf("only %d go test lines found in .ci/run: its form changed?", runs)
	}
}

var root = filepath.Join("..", "..", "..")

func testingDoc(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

type tableRow struct {
	line  int
	cells []string
}

// tableRows are the rows of the document's tables (not their heads or rules), each
// split into its cells.
func tableRows(doc string) []tableRow {
	var rows []tableRow
	for i, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| guard |") {
			continue
		}
		rows = append(rows, tableRow{line: i + 1, cells: strings.Split(strings.Trim(l, "| "), " | ")})
	}
	return rows
}

// goFiles calls f for each .go file of the module (not under a dot directory), with its
// directory relative to the module's root.
func goFiles(t *testing.T, f func(dir, path string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		dir, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		f(filepath.ToSlash(dir), p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testIndex maps each test function of the module to the directories that define it.
func testIndex(t *testing.T) map[string][]string {
	t.Helper()
	tests := map[string][]string{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]*)\(`)
	goFiles(t, func(dir, p string) {
		if !strings.HasSuffix(p, "_test.go") {
			return
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			if !slices.Contains(tests[m[1]], dir) {
				tests[m[1]] = append(tests[m[1]], dir)
			}
		}
	})
	return tests
}

// packageNames maps each name a package goes by (its directory's name, its package
// clause) to its directories.
func packageNames(t *testing.T) map[string]map[string]bool {
	t.Helper()
	names := map[string]map[string]bool{}
	add := func(name, dir string) {
		if names[name] == nil {
			names[name] = map[string]bool{}
		}
		names[name][dir] = true
	}
	clause := regexp.MustCompile(`(?m)^package ([a-z][a-z0-9]*)\s*$`)
	goFiles(t, func(dir, p string) {
		add(path.Base(dir), dir)
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if m := clause.FindSubmatch(src); m != nil && !strings.HasSuffix(string(m[1]), "_test") {
			add(string(m[1]), dir)
		}
	})
	return names
}

// declared is what the module's non-test files declare.
type declared struct {
	vars   map[string]map[string]bool // by directory: package-level variables
	fields map[string]map[string]bool // by struct type name: its fields
	any    map[string]bool            // every name: fields, variables, constants, types, functions, methods
}

func declarations(t *testing.T) declared {
	t.Helper()
	d := declared{vars: map[string]map[string]bool{}, fields: map[string]map[string]bool{}, any: map[string]bool{}}
	fset := token.NewFileSet()
	goFiles(t, func(dir, p string) {
		if strings.HasSuffix(p, "_test.go") {
			return
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if d.vars[dir] == nil {
			d.vars[dir] = map[string]bool{}
		}
		for _, dc := range f.Decls {
			if g, ok := dc.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, s := range g.Specs {
					for _, n := range s.(*ast.ValueSpec).Names {
						d.vars[dir][n.Name] = true
					}
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.TypeSpec:
				d.any[n.Name.Name] = true
				if st, ok := n.Type.(*ast.StructType); ok {
					if d.fields[n.Name.Name] == nil {
						d.fields[n.Name.Name] = map[string]bool{}
					}
					for _, fl := range st.Fields.List {
						for _, nm := range fl.Names {
							d.fields[n.Name.Name][nm.Name] = true
						}
					}
				}
			case *ast.Field:
				for _, nm := range n.Names {
					d.any[nm.Name] = true
				}
			case *ast.ValueSpec:
				for _, nm := range n.Names {
					d.any[nm.Name] = true
				}
			case *ast.FuncDecl:
				d.any[n.Name.Name] = true
			}
			return true
		})
	})
	return d
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
