//go:build race

package clustertest

// raceBuild is true when the test binary has the race detector: Binaries and
// FlowdLinkedWith then build flowd with it too.
const raceBuild = true
