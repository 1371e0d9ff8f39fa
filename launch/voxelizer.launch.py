"""lidar_kernels `voxelizer` node. Voxelize (hard | dynamic) and/or voxel-grid downsample. Outputs ~/voxels, ~/downsampled.

ros2 launch lidar_kernels voxelizer.launch.py params_file:=/path/orin.param.yaml points:=/sensor/topic
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution([FindPackageShare('lidar_kernels'), 'config', 'cpu.param.yaml']),
            description='Node parameters (config/orin|xavier|desktop_gpu|cpu.param.yaml or your own).'),
        DeclareLaunchArgument('points', default_value='/points', description='Input PointCloud2 topic.'),
        DeclareLaunchArgument('namespace', default_value='', description='Namespace of the node.'),
        DeclareLaunchArgument('node_name', default_value='voxelizer', description='Name of the node.'),
        DeclareLaunchArgument('reliable', default_value='true', description='Input QoS reliable (true) or best effort.'),
        Node(
            package='lidar_kernels',
            executable='voxelizer',
            name=LaunchConfiguration('node_name'),
            namespace=LaunchConfiguration('namespace'),
            output='screen',
            parameters=[LaunchConfiguration('params_file'), {'reliable': LaunchConfiguration('reliable')}],
            remappings=[('points', LaunchConfiguration('points'))],
        ),
    ])
