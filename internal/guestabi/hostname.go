package guestabi

// ValidHostname reports whether s may be a box's host name (Boot.Hostname,
// the agent's Restored): at most 63 letters, digits and '-'.
func ValidHostname(s string) bool {
	if len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// BoxHostname is the host name of box id named name (or ""): hostname
// when it is set, else name when that is a valid host name, else id.
func BoxHostname(hostname, name, id string) string {
	if hostname != "" {
		return hostname
	}
	if name != "" && ValidHostname(name) {
		return name
	}
	return id
}
