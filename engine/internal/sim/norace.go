//go:build !race

package sim

// raceEnabled: the race detector is on (race.go, norace.go); the tests run fewer seeds.
const raceEnabled = false
