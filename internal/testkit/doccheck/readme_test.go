package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every W1 or W2 figure the README's status table quotes is one docs/perf.md records:
// the README once quoted figures two rounds old that perf.md no longer had (issue 38).
// The table points to perf.md for the figures; a figure it does quote must be there.
func TestREADMEQuotesOnlyPerfFigures(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	perf, err := os.ReadFile(filepath.Join(root, "docs", "perf.md"))
	if err != nil {
		t.Fatal(err)
	}
	status := string(readme)
	i := strings.Index(status, "## Status")
	if i < 0 {
		t.Fatal("README.md has no ## Status")
	}
	status = status[i:]
	if j := strings.Index(status[len("## Status"):], "\n## "); j >= 0 {
		status = status[:len("## Status")+j]
	}
	figure := regexp.MustCompile(`(\d[\d,]*(?:\.\d+)?)\s*(steps/s|runs/s|ms|%)`)
	quoted := 0
	for _, line := range strings.Split(status, "\n") {
		if !strings.Contains(line, "W1") && !strings.Contains(line, "W2") {
			continue
		}
		for _, cell := range strings.Split(line, "|") {
			if !strings.Contains(cell, "W1") && !strings.Contains(cell, "W2") {
				continue
			}
			for _, m := range figure.FindAllStringSubmatch(cell, -1) {
				quoted++
				want := m[1] + " " + m[2] // with its unit: "3.75" alone is too common to mean the figure
				if m[2] == "%" {
					want = m[1] + "%"
				}
				if !strings.Contains(string(perf), want) {
					t.Errorf("README.md's status quotes %q (%s), which docs/perf.md does not record: quote perf.md's figure or point to it", m[0], strings.TrimSpace(cell)[:min(60, len(strings.TrimSpace(cell)))])
				}
			}
		}
	}
	if !strings.Contains(status, "docs/perf.md") {
		t.Error("README.md's status does not point to docs/perf.md")
	}
	t.Logf("%d W1/W2 figures quoted", quoted)
}
