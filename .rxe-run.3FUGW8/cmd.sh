cd /work/main/build
export PATH=/opt/bin:$PATH HOME=/tmp
/work/main/tests/rxe/suite.sh /work/main/build 
