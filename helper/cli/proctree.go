package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Processes from /proc: a process's children and its whole tree.

// procChildren lists the children of pid: the union of
// /proc/PID/task/TID/children over its threads (a child belongs to the
// thread that forked it); on a kernel without those files
// (CONFIG_PROC_CHILDREN), the processes whose parent is pid.
func procChildren(pid int) ([]int, error) {
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		return nil, fmt.Errorf("no process %d", pid)
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return childrenByParent(pid)
	}
	var out []int
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread has exited
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil && !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// childrenByParent scans /proc for the processes whose parent is pid.
func childrenByParent(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStatFields(p); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}

// procStatFields are the fields of /proc/PID/stat after the command name:
// state, ppid, pgrp, session... (nil if there is no pid).
func procStatFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// processTree is pid and all its descendants (children recursively), the
// tree CRIU dumps for pid.
func processTree(pid int) []int {
	tree := []int{pid}
	for i := 0; i < len(tree); i++ {
		kids, err := procChildren(tree[i])
		if err != nil {
			continue // exited meanwhile
		}
		for _, k := range kids {
			if !slices.Contains(tree, k) {
				tree = append(tree, k)
			}
		}
	}
	return tree
}

// processExists says whether pid is a process (a zombie is not).
func processExists(pid int) bool {
	st := procStateLetter(pid)
	return st != "" && st != "Z" && st != "X"
}

// procStateLetter is pid's state from /proc/PID/stat ("" if there is no pid).
func procStateLetter(pid int) string {
	if f := procStatFields(pid); len(f) > 0 {
		return f[0]
	}
	return ""
}
