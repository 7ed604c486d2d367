package checkpoint

import (
	"fmt"
	"testing"
)

// BenchmarkApply: the state machine alone (Pebble NoSync), 16 commits per message
// (APPLY_PER=1: one), in each log format, decoding included.
func BenchmarkApply(b *testing.B) {
	for _, format := range []int{LogFormatJSON, LogFormatBinary} {
		b.Run(fmt.Sprintf("format-%d", format), func(b *testing.B) { benchApply(b, format) })
	}
}
