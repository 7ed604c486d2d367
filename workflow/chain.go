package workflow

import (
	"fmt"
	"strings"
)

// ChainYAML is the YAML of the W1 and W2 workloads' workflow (docs/perf.md): n no-op
// steps, each needing the one before. The engine's benchmarks and `flowctl bench` both
// run it.
func ChainYAML(name string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\ndescription: %d no-op steps in a chain (the W1/W2 workloads)\nsteps:\n", name, n)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  - name: s%d\n    uses: noop\n", i)
		if i > 1 {
			fmt.Fprintf(&b, "    needs: [s%d]\n", i-1)
		}
	}
	return b.String()
}
