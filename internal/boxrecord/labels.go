package boxrecord

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Bounds of a box's labels (the root package's BoxOptions.Labels and its
// MaxLabels, MaxLabelKeyLen, MaxLabelValueLen).
const (
	// MaxLabels is the most labels a box may have.
	MaxLabels = 64
	// MaxLabelKeyLen is the longest label key, in bytes.
	MaxLabelKeyLen = 128
	// MaxLabelValueLen is the longest label value, in bytes.
	MaxLabelValueLen = 1024
)

// CheckLabels checks a box's labels against their bounds.
func CheckLabels(l map[string]string) error {
	if len(l) > MaxLabels {
		return fmt.Errorf("%d labels: want at most %d", len(l), MaxLabels)
	}
	for k, v := range l {
		if k == "" || len(k) > MaxLabelKeyLen || !labelText(k) {
			return fmt.Errorf("label key %.40q: want 1..%d bytes of UTF-8 text without control characters", k, MaxLabelKeyLen)
		}
		if len(v) > MaxLabelValueLen || !labelText(v) {
			return fmt.Errorf("label %.40q: value of %d bytes: want at most %d bytes of UTF-8 text without control characters", k, len(v), MaxLabelValueLen)
		}
	}
	return nil
}

// labelText says s is valid UTF-8 without control characters.
func labelText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if unicode.IsControl(c) {
			return false
		}
	}
	return true
}
