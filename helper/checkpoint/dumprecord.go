package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// A dump records in the image directory how it ran CRIU (dumpRecordName),
// so that a restore repeats what CRIU needs repeated: an image dumped with
// --shell-job restored without it failed on "Can't fork for N: File
// exists", N being the session of the shell the process was started from,
// and gpucr said that pid N was taken by another process. The record is
// written into the dump's private directory and published with CRIU's
// images (stage.go: 0600, renamed into DIR only once the dump succeeded); a
// restore reads it beneath DIR's descriptor, following no link, and only if
// it belongs to the user who restores, as it does CRIU's images.

// dumpRecordName is the record's file in the image directory.
const dumpRecordName = "gpucr-dump.json"

// dumpRecordFormat is the record's format version.
const dumpRecordFormat = 1

// maxDumpRecord bounds the record read: a few hundred bytes.
const maxDumpRecord = 64 << 10

// DumpRecord is how a dump ran CRIU: the options that shape its images.
type DumpRecord struct {
	Format         int    `json:"format"`
	ShellJob       bool   `json:"shell_job,omitempty"`
	TCPEstablished bool   `json:"tcp_established,omitempty"`
	ExtUnixSockets bool   `json:"ext_unix_sk,omitempty"`
	FileLocks      bool   `json:"file_locks,omitempty"`
	LinkRemap      bool   `json:"link_remap,omitempty"`
	ManageCgroups  string `json:"manage_cgroups,omitempty"`
	// NetworkLock is the lock a dump of TCP connections used: a restore
	// locks the network alike ("skip": the connections were all inside the
	// tree, and the host may have no iptables).
	NetworkLock string   `json:"network_lock,omitempty"`
	External    []string `json:"external,omitempty"`
	CRIUOpts    []string `json:"criu_opts,omitempty"`
}

// dumpRecordOf is the record of a dump run with c.
func dumpRecordOf(c CRIU) DumpRecord {
	return DumpRecord{Format: dumpRecordFormat, ShellJob: c.ShellJob, TCPEstablished: c.TCPEstablished,
		ExtUnixSockets: c.ExtUnixSockets, FileLocks: c.FileLocks, LinkRemap: c.LinkRemap, ManageCgroups: c.ManageCgroups,
		NetworkLock: c.NetworkLock,
		External:    slices.Clone(c.External), CRIUOpts: slices.Clone(c.Extra)}
}

// writeDumpRecord writes rec into the private directory stage (a new
// file, 0600): publish moves it into DIR with CRIU's images.
func writeDumpRecord(stage *os.File, rec DumpRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(int(stage.Fd()), dumpRecordName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", dumpRecordName, err)
	}
	f := os.NewFile(uintptr(fd), dumpRecordName)
	_, err = f.Write(append(b, '\n'))
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("%s: %w", dumpRecordName, err)
	}
	return nil
}

// readDumpRecord reads the record of the image directory dir: nil without
// one (an image of a gpucr before records, or of criu dump itself). A
// record that is not a regular file of the caller's is not read (why
// says so).
func readDumpRecord(dir string) (rec *DumpRecord, why string, err error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("image directory %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, dumpRecordName, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, "", nil
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Sprintf("%s/%s is a symlink", dir, dumpRecordName), nil
	case err != nil:
		return nil, "", fmt.Errorf("%s/%s: %w", dir, dumpRecordName, err)
	}
	f := os.NewFile(uintptr(fd), dumpRecordName)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, "", fmt.Errorf("%s/%s: %w", dir, dumpRecordName, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Sprintf("%s/%s is not a regular file", dir, dumpRecordName), nil
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Sprintf("%s/%s belongs to uid %d, not to uid %d, who restores", dir, dumpRecordName, st.Uid, os.Geteuid()), nil
	}
	b, err := io.ReadAll(io.LimitReader(f, maxDumpRecord+1))
	if err != nil {
		return nil, "", fmt.Errorf("%s/%s: %w", dir, dumpRecordName, err)
	}
	if len(b) > maxDumpRecord {
		return nil, fmt.Sprintf("%s/%s is larger than %d bytes", dir, dumpRecordName, maxDumpRecord), nil
	}
	var r DumpRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Sprintf("%s/%s does not parse: %v", dir, dumpRecordName, err), nil
	}
	if r.Format != dumpRecordFormat {
		return nil, fmt.Sprintf("%s/%s is of format %d, which this gpucr does not know", dir, dumpRecordName, r.Format), nil
	}
	return &r, "", nil
}

// applyTo turns on in c the options of the dump that its restore must
// repeat, and returns them as CRIU's command line names them ("shell-job").
// The rest is for the caller to judge (notes).
func (r DumpRecord) applyTo(c *CRIU) (applied []string) {
	on := func(dumped bool, opt *bool, name string) {
		if dumped && !*opt {
			*opt = true
			applied = append(applied, name)
		}
	}
	on(r.ShellJob, &c.ShellJob, "--shell-job")
	if !c.TCPClose { // restoring the connections closed needs no more
		on(r.TCPEstablished, &c.TCPEstablished, "--tcp-established")
	}
	on(r.ExtUnixSockets, &c.ExtUnixSockets, "--ext-unix-sk")
	on(r.FileLocks, &c.FileLocks, "--file-locks")
	if r.NetworkLock != "" && c.NetworkLock == "" && !extraHas(c.Extra, "network-lock") {
		c.NetworkLock = r.NetworkLock
		applied = append(applied, "--network-lock "+r.NetworkLock)
	}
	if r.ManageCgroups != "" && c.ManageCgroups == "" {
		c.ManageCgroups = r.ManageCgroups
		applied = append(applied, "--manage-cgroups "+r.ManageCgroups)
	}
	return applied
}

// notes says what of the dump's options a restore run with c does not
// repeat by itself: resources the dump declared external, which a restore
// must be told where to find, and --criu-opt options gpucr does not know
// (those the restore is given too are not named).
func (r DumpRecord) notes(c CRIU) []string {
	var out []string
	if len(r.External) > 0 && len(c.External) == 0 {
		out = append(out, fmt.Sprintf("the image was dumped with --external %q: a restore may need CRIU's --external or --inherit-fd for them", r.External))
	}
	var opts []string
	for _, o := range r.CRIUOpts {
		if !slices.Contains(c.Extra, o) {
			opts = append(opts, o)
		}
	}
	if len(opts) > 0 {
		out = append(out, fmt.Sprintf("the image was dumped with --criu-opt %q, which gpucr does not repeat by itself: give the restore those CRIU needs there", opts))
	}
	return out
}
