// Package cli is flowctl: its commands (cobra), their flags, output formats (table,
// json, yaml) and exit codes (0 ok, 1 the thing asked for failed, 2 bad usage or input,
// 3 server unreachable). Run writes to the writers it is given, so commands are tested
// as functions.
package cli
