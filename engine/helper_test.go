package engine

// helperMain runs a child-process role of this test binary; it reports whether it did.
func helperMain() bool { return false }
