//go:build !race

package checkpoint

// raceEnabled: the race detector is on (tests that walk many crash points walk fewer).
const raceEnabled = false
