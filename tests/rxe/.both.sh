#!/bin/bash
cd /work/main
bench/verbs-vs-perftest.sh gbuild
tests/rxe/suite.sh gbuild
