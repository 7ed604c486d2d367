// Command flowctl controls flow: see docs/cli.md and flowctl --help.
package main

import (
	"os"

	"github.com/flowrun/flow/internal/app/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}
