// Command flowd is the flow daemon: see docs/operations.md and flowd --help.
package main

import (
	"os"

	"github.com/flowrun/flow/internal/flowd"
)

func main() {
	os.Exit(flowd.Main(os.Args[1:], nil))
}
