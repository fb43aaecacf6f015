package checkpoint

import "fmt"

// A job connection whose receiver's buffer is full at the cut is dumped
// with bytes never sent in the sender's queue. CRIU restores those out of
// repair mode, in the middle of the part's restore, and the kernel then
// sends a window probe at once: a probe that reaches a host where the
// other end does not exist yet is answered with a reset, and the
// connection is lost. So such a sender's part is made only once every
// other part is made, its sockets there (in repair mode, held at the
// restore's barrier), which is possible while no sending part's receiver
// sends so too.

// restorableOrder says whether a restore can make every receiver of an
// unsent queue before its sender: parts are the job's, each with its
// connections to other parts and those of them dumped with unsent bytes.
func restorableOrder(parts []JobRecordPart) error {
	holder := map[JobConn]int{} // a connection's end -> the part that holds it
	for k, p := range parts {
		for _, c := range p.Conns {
			holder[c] = k
		}
	}
	for i, p := range parts {
		for _, c := range p.Unsent {
			if k, ok := holder[c.Peer()]; ok && k != i && len(parts[k].Unsent) > 0 {
				return fmt.Errorf("%s's connection %s holds bytes never sent, which its receiver's full buffer keeps, and the receiver's part "+
					"(%s) holds some too: a restore must make each such receiver before its sender, which no order does; nothing was "+
					"dumped. Checkpoint when the stream pauses, or with the receivers reading", p.Host, c, parts[k].Host)
			}
		}
	}
	return nil
}

// restorePhases splits the parts of a job record for its restore: first
// every part that sends nothing left unsent, then the others.
func restorePhases(records []*JobRecord) (first, then []int) {
	for i, r := range records {
		if r != nil && r.Part >= 0 && r.Part < len(r.Parts) && len(r.Parts[r.Part].Unsent) > 0 {
			then = append(then, i)
		} else {
			first = append(first, i)
		}
	}
	return first, then
}
