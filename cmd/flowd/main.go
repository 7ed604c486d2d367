// Command flowd is the flow daemon: see docs/operations.md and flowd --help. A program
// that runs flowd with step kinds of its own calls package flowd's Main the same way.
package main

import (
	"os"

	"github.com/flowrun/flow/flowd"
)

func main() {
	os.Exit(flowd.Main(os.Args[1:]))
}
