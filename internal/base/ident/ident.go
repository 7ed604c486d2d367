package ident

// IDRule says what ValidID accepts, for error messages.
const IDRule = "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, with no '.' at the end or two in a row"

// ValidID reports whether s can name a run or an owner (IDRule). Run IDs are JetStream
// KV keys (the run leases') and subject tokens, so they follow both rules: no ':' or
// other punctuation, and no empty token between dots ("a." and "a..b" are refused: as
// keys they are invalid, and such a run once stayed pending forever).
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 128 || !alnum(s[0]) || s[len(s)-1] == '.' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !alnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
		if c == '.' && s[i-1] == '.' {
			return false
		}
	}
	return true
}

// ValidName reports whether s can name a workflow or step: 1-64 of a-z, 0-9, '_' or
// '-', starting with a letter or digit.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		lowerOrDigit := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
		if !lowerOrDigit && (i == 0 || (c != '_' && c != '-')) {
			return false
		}
	}
	return true
}

func alnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
